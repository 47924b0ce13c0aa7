"""Collectives a DeviceMesh's groups run below Python: DTensor's (tensor and sequence parallel),
compiled FSDP2's, torchtitan's, read from torch's Flight Recorder.

DTensor redistributes through ``torch.distributed._functional_collectives``, whose ops
(``torch.ops._c10d_functional.all_reduce`` and its kind) call the process group's backend from
C++: no ``ProcessGroup`` method the attach wraps (:mod:`.collectives`) sees them, and a
compiled graph calls them the same way. torch's Flight Recorder records them like any other
collective of the group (``gloo:all_reduce`` with its sizes and sequence number). So every
group of every mesh the job builds is watched by the recorder's reader
(:mod:`.flight_recorder`), as DDP's group is: the entries the wrappers recorded themselves are
claimed by sequence number, and the rest (the functional collectives) are read by the sender
thread, each labelled with its mesh dimension's name (``tp``, ``dp``; ``mesh`` when the mesh
names none). Nothing runs per collective on the training thread for them, and nothing per step
beyond the recorder's one sequence-number read per watched group at the step end.

The mesh is found when it is built (``DeviceMesh.__init__``, ``DeviceMesh.from_group`` and the
private ``_unflatten`` wrapped at class level, once the job imports
``torch.distributed.device_mesh``); a slice of a mesh (``mesh["tp"]``) holds groups its root
mesh's watch took already, and a flattened one (``mesh["dp", "cp"]._flatten()``) is built by
``__init__`` with its own.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from . import patches, postimport
from .collectives import kept_out
from .flight_recorder import READER as RECORDER
from .session import SESSION

RESHAPES = ("_unflatten",)
"""DeviceMesh's methods that make a mesh with groups of its own after ``__init__`` (a flattened
mesh, torchtitan's ``dp_shard_cp``, is built by ``__init__`` with its new group: watched there)."""


def watch_mesh(mesh: Any) -> None:
    """Watch every group of ``mesh`` in the Flight Recorder, labelled by its dimension."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    groups = mesh.get_all_groups()
    for dim, group in enumerate(groups):
        RECORDER.watch(group, names[dim] if dim < len(names) else "mesh")


def _watch(mesh: Any) -> None:
    """:func:`watch_mesh`, or, if the mesh's groups are unreadable, said once (Log screen, the
    run's console) and left."""
    if SESSION.passive:
        return
    try:
        watch_mesh(mesh)
    except Exception as exc:
        SESSION.lost(
            "collectives a DeviceMesh's groups run below Python (DTensor, compiled FSDP2)",
            f"the mesh's groups are unreadable ({exc!r})",
        )


def _watching(make: Any) -> Any:
    """``make`` (a method returning a new mesh), the mesh it returns watched."""

    def made(self: Any, *args: Any, **kwargs: Any) -> Any:
        mesh = make(self, *args, **kwargs)
        _watch(mesh)
        return mesh

    made.__doc__ = make.__doc__
    return made


def _ready(module: ModuleType) -> None:
    mesh_class = module.DeviceMesh
    init = mesh_class.__init__
    from_group = mesh_class.from_group

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if kwargs.get("_init_backend", True):  # (else a slice, or from_group's: no groups yet)
            _watch(self)

    def from_group_(*args: Any, **kwargs: Any) -> Any:
        """A mesh over groups the job made itself: its groups are set after ``__init__``."""
        mesh = from_group(*args, **kwargs)
        _watch(mesh)
        return mesh

    __init__.__doc__ = init.__doc__
    from_group_.__doc__ = from_group.__doc__
    patches.replace(mesh_class, "__init__", __init__)
    patches.replace(mesh_class, "from_group", staticmethod(from_group_))
    codes = [__init__.__code__, from_group_.__code__, _watch.__code__, watch_mesh.__code__]
    # An unflattened mesh is built without groups and given new ones after: watched as the
    # method making it returns.
    for name in RESHAPES:
        made = _watching(getattr(mesh_class, name))
        patches.replace(mesh_class, name, made)
        codes.append(made.__code__)
    postimport.when_imported(  # never a frame Dynamo compiles
        "torch._dynamo.eval_frame", lambda m: kept_out(m, codes, "around DeviceMesh's init")
    )


def install() -> None:
    """Wrap ``DeviceMesh.__init__`` once the job imports ``torch.distributed.device_mesh``
    (never imported here: a job without meshes loads nothing more)."""
    postimport.when_imported("torch.distributed.device_mesh", _ready)
