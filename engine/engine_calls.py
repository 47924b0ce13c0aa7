"""DeepSpeed engine calls around the training loop: saving (checkpoints, the 16-bit model),
``no_sync``, ``deepspeed_io``, ``zero_grad``, ``train``/``eval`` and attribute pass-through to
the module. Mixed into :class:`~.engine.ZeroEngine`; engine/engine.py keeps the loop itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import Self

if TYPE_CHECKING:
    from .config import DeepSpeedConfig
    from .process_group import Comm
    from .report import Reporter


class EngineCalls:
    """Mixed into :class:`~.engine.ZeroEngine`; every method is DeepSpeed's, same name and
    meaning (differences are said where they are)."""

    _config: DeepSpeedConfig
    _inside_no_sync: bool
    comm: Comm
    module: torch.nn.Module
    reporter: Reporter
    strategy: Any

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DeepSpeed's ``no_sync``: backward inside it never reduces gradients (they accumulate
        locally), and ``step()`` inside it is an error. Stages 0-1 only: stages 2-3 reduce
        every backward by design."""
        if self._config.zero_optimization.stage >= 2:
            raise AssertionError(
                f"no_sync context manager is incompatible with gradient partitioning logic of "
                f"ZeRO stage {self._config.zero_optimization.stage}"
            )
        if self._inside_no_sync:
            raise AssertionError("no_sync context manager reentry is unsupported")
        self._inside_no_sync = True
        try:
            yield
        finally:
            self._inside_no_sync = False

    def deepspeed_io(
        self, dataset: Any, batch_size: int | None = None, collate_fn: Any = None, **_: Any
    ) -> Any:
        """DeepSpeed's ``deepspeed_io``: the engine's data loader for ``dataset``."""
        from .dataloader import training_loader

        return training_loader(
            dataset,
            self._config,
            rank=self.comm.rank,
            world_size=self.comm.world_size,
            collate_fn=collate_fn,
            batch_size=batch_size,
        )

    def zero_grad(self) -> None:
        """DeepSpeed's ``zero_grad``: drop the module's ``param.grad`` (the strategies keep
        their own reduced-gradient buffers, which the optimizer step already cleared)."""
        for param in self.module.parameters():
            param.grad = None

    def __getattr__(self, name: str) -> Any:
        """Attributes the engine does not define come from the module, as in DeepSpeed."""
        module = self.__dict__.get("module")
        if module is not None and not name.startswith("__"):
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def compile(
        self,
        backend: Any = "inductor",
        compile_kwargs: dict[str, Any] | None = None,
        schedule: Any = None,
        compiled_autograd_enabled: bool = False,
    ) -> None:
        """DeepSpeed's ``engine.compile()``: ``torch.compile`` of the wrapped module in place
        (``module.compile``: the module object, its parameters and the engine's hooks stay as
        they are; the engine's forward, backward and step run eagerly around it). Calling it
        again does nothing, as in DeepSpeed. DeepCompile's ``schedule`` and compiled autograd
        are DeepSpeed's own compiler passes: not implemented here (an error, never a silent
        different program). The reporter stops marking repeated blocks for the agent: their
        hooks would sit inside the compiled graph (the per-block activation split is NA)."""
        if schedule is not None or compiled_autograd_enabled:
            raise NotImplementedError(
                "engine.compile(schedule=..., compiled_autograd_enabled=True) are DeepSpeed's "
                "DeepCompile passes; this engine compiles the module with torch.compile only"
            )
        if self.__dict__.get("_is_compiled"):
            return
        self.module.compile(**{**(compile_kwargs or {}), "backend": backend})
        self.reporter.compiled()
        self.__dict__["_is_compiled"] = True

    @property
    def is_compiled(self) -> bool:
        """DeepSpeed's ``engine.is_compiled``: whether :meth:`compile` ran."""
        return bool(self.__dict__.get("_is_compiled", False))

    def train(self, mode: bool = True) -> Self:
        self.module.train(mode)
        return self

    def eval(self) -> Self:
        self.module.eval()
        return self

    def parameters(self, recurse: bool = True) -> Any:
        return self.module.parameters(recurse)

    # -- checkpoints (engine/checkpoint_files.py) and clean-up --------------------------------

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: dict[str, Any] | None = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """DeepSpeed's ``save_checkpoint`` (engine/checkpoint_files.py). Frozen parameters are
        saved whatever ``exclude_frozen_parameters`` says (the checkpoint must reload whole)."""
        from .checkpoint_files import save_checkpoint

        return save_checkpoint(self, save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir: str, tag: str | None = None, **options: Any) -> Any:
        from .checkpoint_files import load_checkpoint

        return load_checkpoint(self, load_dir, tag, **options)

    def destroy(self) -> None:
        """Release what the strategy holds outside the process (NVMe swap files)."""
        close = getattr(self.strategy, "close", None)
        if close is not None:
            close()

    def save_16bit_model(
        self,
        save_dir: str,
        save_filename: str = "pytorch_model.bin",
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """DeepSpeed's ``save_16bit_model``: the full 16-bit weights in one file written by
        rank 0 (``torch.save``, or safetensors for a ``.safetensors`` name: engine/model_save.py);
        every rank must call it. At stage 3 it needs ``stage3_gather_16bit_weights_on_model_save``
        (else it logs why and returns False)."""
        save = getattr(self.strategy, "save_16bit_model", None)
        if save is not None:
            saved = bool(save(save_dir, save_filename, exclude_frozen_parameters))
            if not saved:  # stage 3 without gathering: the advisor names the fix
                self.reporter.tel.event(
                    "checkpoint",
                    "save_16bit_model skipped: stage3_gather_16bit_weights_on_model_save is off",
                    value=0.0,
                )
            return saved
        if self.comm.rank == 0:  # stages 0-2: every rank holds the full parameters
            from .model_save import write_model_file

            os.makedirs(save_dir, exist_ok=True)
            write_model_file(
                os.path.join(save_dir, save_filename),
                self.module_state_dict(exclude_frozen_parameters=exclude_frozen_parameters),
            )
        return True

    save_fp16_model = save_16bit_model
    """DeepSpeed's older name."""

    def module_state_dict(self, exclude_frozen_parameters: bool = False) -> dict[str, Any]:
        """The module's ``state_dict`` (stage 3: its buffers and empty placeholders; use
        :meth:`_zero3_consolidated_16bit_state_dict`)."""
        state = self.module.state_dict()
        if exclude_frozen_parameters:
            for name, param in self.module.named_parameters():
                if not param.requires_grad:
                    state.pop(name, None)
        return state

    def _zero3_consolidated_16bit_state_dict(
        self, exclude_frozen_parameters: bool = False
    ) -> dict[str, torch.Tensor] | None:
        """Stage 3: the full weights on rank 0 (None on the others); every rank must call it.
        The name is DeepSpeed's; accelerate and the Hugging Face Trainer call it to save."""
        consolidate = getattr(self.strategy, "consolidated_16bit_state_dict", None)
        if consolidate is None:
            raise ValueError("this function requires ZeRO-3 mode")
        return consolidate(exclude_frozen_parameters)
