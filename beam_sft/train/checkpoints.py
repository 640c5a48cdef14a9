"""Checkpoints that count only when complete: see docs/training.md#when-a-job-fails."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import shutil
import time
from pathlib import Path

from beam_sft.errors import FatalError
from beam_sft.storage import fsync_file, write_json_atomic
from beam_sft.train.faults import agree_any, gather_objects

logger = logging.getLogger(__name__)

MARKER = "beam_checkpoint.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")
# What a transformers checkpoint holds whatever the strategy: the files a marker-less directory is described by.
_EXPECTED = ("trainer_state.json",)
EXIT_DISK_FULL = 74  # sysexits EX_IOERR: free space, then resume


class DiskFullError(FatalError):
    """A checkpoint could not be written for lack of space; the previous complete one is untouched."""

    exit_code = EXIT_DISK_FULL


def step_of(path: Path) -> int:
    found = _NAME.match(path.name)
    return int(found.group(1)) if found else -1


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Every `checkpoint-N` directory of output_dir, oldest step first."""
    if not (root := Path(output_dir)).is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)), key=step_of)


def _files(path: Path) -> dict[str, int]:
    return {str(f.relative_to(path)): f.stat().st_size for f in sorted(path.rglob("*"))
            if f.is_file() and f.name != MARKER and not f.name.startswith(f".{MARKER}")}


def lacks(path: Path) -> str | None:
    """What keeps checkpoint `path` from being resumed, in a few words; None when it is complete."""
    if not (marker := path / MARKER).is_file():
        have = sorted(_files(path))
        missing = [name for name in _EXPECTED if name not in have]
        shown = ", ".join(have[:6]) + (f" and {len(have) - 6} more" if len(have) > 6 else "")
        return (f"no commit marker {MARKER} (a save that did not finish, or written without beam-sft); "
                f"has {shown or 'no files'}" + (f"; lacks {', '.join(missing)}" if missing else ""))
    try:
        listed = json.loads(marker.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable commit marker ({err})"
    present = _files(path)
    for name, size in listed.items():
        if name not in present:
            return f"{name} is gone (the marker lists it)"
        if present[name] != size:
            return f"{name} is {present[name]} bytes, the marker says {size}"
    return None


def is_complete(path: str | Path) -> bool:
    return lacks(Path(path)) is None


def last_complete(output_dir: str | Path, say=logger.warning) -> str | None:
    """The newest complete checkpoint of output_dir; each newer incomplete one named in one line with what it
    lacks (older incomplete ones are leftovers the rotation removes)."""
    for path in reversed(checkpoint_dirs(output_dir)):
        if (reason := lacks(path)) is None:
            return str(path)
        say(f"not resuming from {path}: incomplete, {reason}")
    return None


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory; the files are flushed already
        fsync_file(path)


def commit(path: Path, step: int, world_size: int) -> None:
    """Write the commit marker of a checkpoint whose every file is written and flushed (atomically, under a
    writer-unique temporary name: two nodes committing one shared directory never leave a half marker)."""
    write_json_atomic(path / MARKER,
                      {"step": step, "world_size": world_size, "time": time.time(), "files": _files(path)})
    _fsync_dir(path)


def rotate(output_dir: str | Path, limit: int | None, keep: str | None = None) -> None:
    """Keep the newest `limit` complete checkpoints (and `keep`, the best model's); remove older complete ones
    and incomplete leftovers older than the newest complete one (after a commit: never what resume takes)."""
    dirs = checkpoint_dirs(output_dir)
    if not (complete := [p for p in dirs if is_complete(p)]):
        return
    protected = set(complete[-limit:] if limit and limit > 0 else complete)
    if keep:
        protected.add(Path(keep))
    newest = step_of(complete[-1])
    removed = []
    for path in dirs:
        if path in protected or step_of(path) >= newest:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        logger.info("removed %s (save_total_limit %s)", ", ".join(p.name for p in removed), limit)


def state_bytes(model, optimizer=None) -> int:
    """About what one checkpoint takes: the model's state and the optimizer's tensors, as held in memory."""
    total = 0
    seen = set()
    for tensor in list(model.state_dict().values()):
        if not hasattr(tensor, "element_size"):
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # FSDP2's DTensor: the shard's storage
        try:
            key = local.untyped_storage().data_ptr()
        except RuntimeError:  # no storage to name (meta, a wrapper): counted, not deduplicated
            key = id(tensor)
        if key in seen:  # tied weights are saved once
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    states = getattr(optimizer, "state", {}).values() if optimizer is not None else ()
    return total + sum(value.numel() * value.element_size() for state in states for value in state.values()
                       if hasattr(value, "element_size"))


def is_disk_full(err: BaseException, directory: Path, needed: int) -> bool:
    """A save that failed for lack of space: ENOSPC (or a quota), or any failed write with less free space left
    than a checkpoint needs (torch.save says only "unexpected pos ..." when the disk fills under it)."""
    if getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err).lower()
    return "no space left" in text or "quota exceeded" in text or free_bytes(directory) < max(needed, 1)


def free_bytes(directory: str | Path) -> int:
    path = Path(directory)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def size_text(n: int) -> str:
    """Bytes as people read them here: GiB from a quarter GiB up, else MiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def disk_full_error(directory: Path, needed: int, free: int, previous: str | None) -> DiskFullError:
    then = (f"{Path(previous).name} is the newest complete checkpoint and stays resumable" if previous
            else "no complete checkpoint yet")
    return DiskFullError(
        f"no space left for {directory}: a checkpoint needs about {needed:,} bytes ({size_text(needed)}), "
        f"{free:,} ({size_text(free)}) were free; {then}; free space (or set save_total_limit) and rerun with "
        "--resume_from_checkpoint last"
    )


def save_guarded(trainer, save, run_dir: str) -> None:
    """`save()` (transformers' `_save_checkpoint`) made a commit: the stale directory of this step cleared
    first, the space checked against the previous checkpoint's size, every rank's writes agreed on, then the
    marker, then rotation. A failed write on any rank removes the partial directory on every rank's storage
    and raises on all of them (a full disk as `DiskFullError`)."""
    args, step = trainer.args, trainer.state.global_step
    if step in trainer.committed_steps:  # a preemption save at the step a periodic save just wrote
        return
    root = Path(run_dir)
    folder = root / f"checkpoint-{step}"
    previous = last_complete(root, say=logger.debug)
    if previous == str(folder):
        previous = None
    needed = sum(f.stat().st_size for f in Path(previous).rglob("*") if f.is_file()) if previous \
        else state_bytes(trainer.model, trainer.optimizer)
    if args.should_save and folder.exists():  # left by a run that got further before it was resumed earlier
        (folder / MARKER).unlink(missing_ok=True)  # incomplete first, then removed
        _fsync_dir(folder)
        shutil.rmtree(folder, ignore_errors=True)
    free = free_bytes(root)
    if agree_any(bool(previous) and args.should_save and free < needed, args.device):
        raise disk_full_error(folder, needed, free, previous)
    error = None
    limit = args.save_total_limit
    try:
        args.save_total_limit = None  # rotation waits for the commit
        save()
        _save_weights_on_this_node(trainer, folder)
        if args.local_process_index == 0 and folder.is_dir():  # flushed to storage: files, then the directory
            for name in sorted(folder.rglob("*")):
                if name.is_file():
                    fsync_file(name)
            _fsync_dir(folder)
    except Exception as err:  # noqa: BLE001 - every rank must reach the agreement below, whatever failed
        error = err
    finally:
        args.save_total_limit = limit
    if error is None:
        error = _missing_here(trainer, folder)
    if agree_any(error is not None, args.device):
        _fail(trainer, folder, error, needed, previous)
    if args.should_save:
        commit(folder, step, args.world_size)
        rotate(root, limit, keep=trainer.state.best_model_checkpoint)
    trainer.committed_steps.add(step)
    trainer.accelerator.wait_for_everyone()


def _save_weights_on_this_node(trainer, folder: Path) -> None:
    """`save_on_each_node` under DDP: transformers (5.x `should_save_on_this_rank`) writes the model weights on
    world rank 0 only, so each other node's saving process writes them itself (every DDP rank holds them)."""
    args = trainer.args
    if not (args.save_on_each_node and args.should_save and args.process_index != 0):
        return
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        return  # sharded: the shards are written by every rank through the framework's own save
    model = trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False)
    if not hasattr(model, "save_pretrained"):
        return
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        model.save_pretrained(str(folder), is_main_process=True)
    finally:
        del model.should_save_on_this_rank


def _missing_here(trainer, folder: Path) -> BaseException | None:
    """Every saving process's copy of the checkpoint holds the files world rank 0 wrote (but the per-rank RNG
    states): a node whose copy lacks any is not committed (a checkpoint without its weights is no checkpoint)."""
    args = trainer.args
    mine = sorted(_files(folder)) if args.should_save and folder.is_dir() else None
    every = gather_objects(mine)
    if not args.should_save or every[0] is None:
        return None
    if not (missing := sorted(n for n in set(every[0]) - set(mine or ()) if not n.startswith("rng_state"))):
        return None
    return FatalError(f"{folder} on this node lacks {', '.join(missing[:5])} (world rank 0 wrote them); not committed")


def _fail(trainer, folder: Path, error: BaseException | None, needed: int, previous: str | None):
    free = free_bytes(folder.parent)
    full = agree_any(error is not None and is_disk_full(error, folder.parent, needed), trainer.args.device)
    if trainer.args.should_save:
        shutil.rmtree(folder, ignore_errors=True)  # the partial save: its space back, nothing to mistake
    trainer.accelerator.wait_for_everyone()
    if full:
        raise disk_full_error(folder, needed, free, previous) from error
    if error is not None:
        raise error
    raise FatalError(f"another rank failed to write {folder}; {Path(previous).name if previous else 'no checkpoint'} "
                     "is the newest complete checkpoint")
