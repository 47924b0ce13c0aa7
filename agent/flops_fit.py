"""FLOPs of a step whose input shapes were never counted, from an exact fit of the counted steps.

A fine-tune with dynamic padding (an HF Trainer's or TRL's collator pads each batch to its
longest sequence) hands its model a new sequence length nearly every micro-batch, so the
step's shapes seldom come back and agent/work.py's count-per-shape ran out of counts after
``MAX_COUNTS`` steps: TFLOP/s and MFU NA for the rest of the run.

What a sequence model's counted FLOPs are made of: a matmul over the positions (every linear
layer, the output layer, LoRA's adapters) costs a fixed amount per position, b·s for a
micro-batch of b sequences of s positions; the attention scores and their use cost b·s² (the
formula torch gives an attention kernel, or the two batched matmuls of an eager one); a head
over one pooled vector per sequence (a classifier) costs b. So a step's FLOPs are

    flops = γ·Σb + α·Σb·s + β·Σb·s²

over its micro-batches, with γ, α, β the model's own. They are solved exactly (rational
arithmetic) from the first three counted steps whose terms are independent, and used only
after a further counted step of new shapes equals what they predict (to 1e-9 relative: the
counter sums in float64). From then on a step whose shapes were never counted gets the fit's
FLOPs, and its Work says so (``flops_fit``, ``flops_step`` the verifying step). A model whose
work is not of that form (a per-forward cost, packed sequences whose attention follows their
boundaries, routing that follows the data) fails the verification, and those steps stay NA
with the reason, as before. One verification can miss a model that departs from the form only
on shapes it has not shown.
"""

from __future__ import annotations

from fractions import Fraction

Terms = tuple[int, int, int]
"""(Σb, Σb·s, Σb·s²) of a step's micro-batches."""

TOLERANCE = 1e-9


def terms(shapes: tuple[tuple[int, ...], ...]) -> Terms | None:
    """A step's terms from its micro-batches' first-input shapes ((b, s) token ids or (b, s, h)
    embeddings), or None when one of them is not a batch of sequences."""
    nb = nbs = nbss = 0
    for shape in shapes:
        if len(shape) not in (2, 3):
            return None
        b, s = shape[0], shape[1]
        nb += b
        nbs += b * s
        nbss += b * s * s
    return (nb, nbs, nbss) if shapes else None


def _solve(rows: list[Terms], values: list[float]) -> tuple[Fraction, ...] | None:
    """The exact solution of the 3x3 system, or None when it is singular (Cramer's rule)."""

    def det(m: list[list[Fraction]]) -> Fraction:
        return (
            m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
        )

    a = [[Fraction(x) for x in row] for row in rows]
    y = [Fraction(v) for v in values]
    d = det(a)
    if d == 0:
        return None
    out = []
    for col in range(3):
        m = [[*row[:col], y[i], *row[col + 1 :]] for i, row in enumerate(a)]
        out.append(det(m) / d)
    return tuple(out)


class FlopsFit:
    """One model's fit: the counted steps it is made from, then verified or refused."""

    __slots__ = ("_points", "coefficients", "refused", "verified_step")

    def __init__(self) -> None:
        self._points: list[tuple[Terms, float, int]] = []
        self.coefficients: tuple[float, float, float] | None = None
        """(γ, α, β), solved exactly and kept as floats: a step's prediction is three products
        on the training thread, not rational arithmetic (its rounding, ~1e-16, is far inside
        the verification's tolerance)."""
        self.verified_step = 0
        """The counted step whose FLOPs the fit predicted (0: not verified yet)."""
        self.refused = ""
        """Why the fit is not used (a verification that did not hold)."""

    @property
    def usable(self) -> bool:
        """Verified (a refused fit is never verified, and a verified one never refused)."""
        return self.verified_step > 0

    def add(self, shapes: tuple[tuple[int, ...], ...], flops: float, step: int) -> None:
        """A counted step: a point to solve from, or the verification once solved."""
        if self.usable or self.refused:
            return
        row = terms(shapes)
        if row is None or any(p[0] == row for p in self._points):
            return  # the same terms again (a check, or the same micro-batches in another order):
            # nothing new to solve from, and a verification that could not fail
        if self.coefficients is not None:
            predicted = self._predict(row)
            if abs(predicted - flops) <= TOLERANCE * max(abs(flops), 1.0):
                self.verified_step = step
            else:
                self.refused = (
                    f"FLOPs not counted for these input shapes: step {step} counted {flops:.4g} "
                    f"where a fit of the counted steps over the micro-batches' b, b·s and b·s² "
                    f"gave {predicted:.4g} (this model's work is not of that form)"
                )
            return
        self._points.append((row, flops, step))
        if len(self._points) >= 3:
            self._fit_from_points()

    def _fit_from_points(self) -> None:
        points = self._points
        n = len(points)
        for i in range(n):  # the first independent triple, the newest point in it
            for j in range(i + 1, n - 1):
                chosen = [points[i], points[j], points[-1]]
                solved = _solve([p[0] for p in chosen], [p[1] for p in chosen])
                if solved is not None:
                    g, a, b = solved
                    self.coefficients = (float(g), float(a), float(b))
                    return

    def _predict(self, row: Terms) -> float:
        assert self.coefficients is not None
        g, a, b = self.coefficients
        return g * row[0] + a * row[1] + b * row[2]

    def predict(self, shapes: tuple[tuple[int, ...], ...]) -> float | None:
        """The FLOPs of a step of ``shapes`` (None: the fit is not usable, or a micro-batch is
        not a batch of sequences)."""
        if not self.usable:
            return None
        row = terms(shapes)
        return None if row is None else self._predict(row)
