"""What a long job does when something goes wrong: see docs/training.md#when-a-job-fails."""

from __future__ import annotations

import gc
import importlib
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

from beam_sft.errors import FatalError, UsageError
from beam_sft.storage import write_json_atomic

logger = logging.getLogger(__name__)

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: a complete checkpoint was written; rerun with --resume_from_checkpoint last
EXIT_NONFINITE = 65  # EX_DATAERR: the loss or a gradient became NaN/Inf; see the records named
STATUS_FILE = "run_status.json"


class NonFiniteError(FatalError):
    exit_code = EXIT_NONFINITE


class Preempted(FatalError):
    """Not a failure: the run saved and stopped on a signal, and goes on when run again."""

    exit_code = EXIT_PREEMPTED
    prefix = "preempted"


def parse_signals(spec: str | None) -> list[signal.Signals]:
    """'SIGTERM,SIGUSR1' (or 'TERM,USR1', or 'none') -> signals; an unknown name is a UsageError."""
    if not spec or spec.strip().lower() in ("none", "no", "off", ""):
        return []
    out = []
    for name in spec.split(","):
        name = name.strip().upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        if name in ("SIGKILL", "SIGSTOP") or not hasattr(signal.Signals, name):
            raise UsageError(f"preemption_signals: {name} is not a signal a process can catch (e.g. SIGTERM,SIGUSR1)")
        out.append(signal.Signals[name])
    return out


def agree_any(flag: bool, device) -> bool:
    """True on every rank if `flag` is True on any (MAX all-reduce); the flag itself without a process group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def gather_objects(obj) -> list:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def make_preemption_callback(signals: list[signal.Signals]):
    from transformers import TrainerCallback

    class Preemption(TrainerCallback):
        """Save and stop at the next step boundary once any rank got one of `signals` (NeMo's rule)."""

        def __init__(self) -> None:
            self.received: int | None = None
            self.stopped_at: int | None = None
            self._previous = {}

        def _handler(self, signum, frame) -> None:
            if self.received is None:
                print(f"beam-sft: got {signal.Signals(signum).name}: saving a checkpoint at the next step end, "
                      "then stopping", file=sys.stderr, flush=True)
            self.received = signum

        def on_train_begin(self, args, state, control, **kwargs):
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handler)

        def on_step_end(self, args, state, control, **kwargs):
            if agree_any(self.received is not None, args.device):
                control.should_save = True
                control.should_training_stop = True
                self.stopped_at = state.global_step
            return control

        def on_train_end(self, args, state, control, **kwargs):
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous = {}

    return Preemption()


class NonFiniteGuard:
    """The non-finite check: `seen` after each micro-batch, `check` with the gradient norm before the step."""

    def __init__(self, policy: str = "stop", max_skips: int = 10) -> None:
        self.policy = policy
        self.max_skips = max_skips
        self.skipped = 0  # steps skipped in all
        self.in_a_row = 0
        self.empty_batches = 0  # micro-batches without a trained token (a 0 loss, not a NaN)
        self.describe_rows = None  # rows -> ["source:line", ...], set by the training job when it knows them
        self._bad = None  # this step's micro-batches: any non-finite loss (a tensor: no sync per micro-batch)
        self._rows: list[int] = []

    def seen(self, loss, rows) -> None:
        import torch

        bad = ~torch.isfinite(loss.detach()).all()
        self._bad = bad if self._bad is None else (self._bad | bad)
        if rows is not None:
            self._rows.extend(int(r) for r in rows.reshape(-1).tolist())

    def check(self, trainer, grad_norm) -> None:
        """Agree across ranks whether this step is finite; stop or skip if not."""
        local_loss = bool(self._bad.item()) if self._bad is not None else False
        local_grad = False
        # Under fp16 the grad scaler's overflow steps are normal (it skips them itself).
        if grad_norm is not None and getattr(trainer.accelerator, "scaler", None) is None:
            value = grad_norm.item() if hasattr(grad_norm, "item") else float(grad_norm)
            local_grad = not math.isfinite(value)
        rows, self._rows, self._bad = self._rows, [], None
        step = trainer.state.global_step + 1
        if not agree_any(local_loss or local_grad, trainer.args.device):
            self.in_a_row = 0
            return
        what = gather_objects({"loss": local_loss, "grad": local_grad, "rows": rows})
        kinds = [kind for kind, key in (("loss", "loss"), ("gradient norm", "grad")) if any(w[key] for w in what)]
        records = self._records([r for w in what for r in w["rows"]])
        if self.policy == "skip" and self.in_a_row < self.max_skips:
            self.skipped += 1
            self.in_a_row += 1
            for param in trainer.model.parameters():  # the optimizer skips parameters without a gradient
                param.grad = None
            if trainer.is_world_process_zero():
                logger.warning("step %d: non-finite %s; step skipped (%d in a row, %d in all; records: %s)",
                               step, " and ".join(kinds), self.in_a_row, self.skipped, records)
            return
        extra = (f" after {self.in_a_row} skipped steps in a row (nonfinite_max_skips {self.max_skips})"
                 if self.policy == "skip" else "")
        raise NonFiniteError(
            f"non-finite {' and '.join(kinds)} at step {step}{extra}; no checkpoint written after it; the batch's "
            f"records: {records}. Lower learning_rate, set max_grad_norm, check those records, or "
            "--on_nonfinite skip; resume with --resume_from_checkpoint last"
        )

    def _records(self, rows: list[int]) -> str:
        if not rows:
            return "not known (a streamed or packed dataset names no rows)"
        rows = sorted(set(rows))
        if self.describe_rows is not None:
            try:
                return ", ".join(self.describe_rows(rows))
            except Exception as err:  # noqa: BLE001 - naming the records must never hide the error itself
                logger.warning("could not name the records of rows %s: %s", rows, err)
        return "training rows " + ", ".join(map(str, rows))


def write_status(output_dir: str, status: str, exit_code: int, **details) -> None:
    """`output_dir/run_status.json`: how the last run of this output_dir ended (rank 0 only)."""
    write_json_atomic(Path(output_dir) / STATUS_FILE,
                      {"status": status, "exit_code": exit_code, "time": time.time(), **details})


def read_status(output_dir: str, since: float) -> dict | None:
    """The status a run that started at `since` wrote, if any."""
    path = Path(output_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return status if status.get("time", 0) >= since else None


def destroy_process_group() -> None:
    """Tear the process group down in order: what holds it (DDP's reducer) first, then the group, so no rank
    is left in a process-group destructor at interpreter exit (seen: a finished rank blocked 8 minutes in
    ~ProcessGroupGloo, called from the reducer's dealloc after main returned)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()
    gc.collect()


def make_step_timeout_callback(seconds: int):
    """From the first step on, collectives wait `seconds` (step_timeout), not the long ddp_timeout of start-up
    (torchtitan's rule); also records where every rank runs, so a lost rank can be named."""
    from transformers import TrainerCallback

    class StepTimeout(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            global _PEERS
            _PEERS = gather_objects((socket.gethostname(), os.getpid()))

        def on_step_end(self, args, state, control, **kwargs):
            if seconds <= 0 or getattr(self, "done", False):
                return
            self.done = True
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            try:
                dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))
            except (AttributeError, RuntimeError, ValueError) as err:  # a backend that cannot: ddp_timeout stays
                logger.warning("step_timeout not applied (%s): collectives keep ddp_timeout", err)

    return StepTimeout()


_PEERS: list = []  # (hostname, pid) of each rank, once training began


def lost_ranks() -> str:
    """The ranks this machine can tell are gone (their process no longer exists), in words."""
    if not _PEERS:
        return "another rank"
    here = socket.gethostname()
    gone = [f"rank {rank} (pid {pid}, gone)" for rank, (host, pid) in enumerate(_PEERS) if host == here and _gone(pid)]
    if gone:
        return ", ".join(gone)
    others = sorted({host for host, _ in _PEERS if host != here})
    return f"a rank on {', '.join(others)}" if others else "another rank"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # dead, not yet reaped by the launcher (torchrun polls its workers): a zombie
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def isolate_restart_store() -> bool:
    """Under torchrun with restarts (`--max_restarts N`): process group keys of their own for the restarted
    workers, else (one agent TCPStore per job, keys not prefixed by attempt since torch 2.4) they read the
    dead ranks' gloo addresses ("Connection refused"). Run before TrainingArguments are parsed; True: done."""
    count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    if count == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False
    from torch.distributed import PrefixStore

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module, not the function
    original = rendezvous._create_c10d_store
    if getattr(original, "beam_sft_attempt", None) == count:
        return True

    def create(*args, **kwargs):
        return PrefixStore(f"beam_sft/attempt_{count}", original(*args, **kwargs))

    create.beam_sft_attempt = count
    rendezvous._create_c10d_store = create
    return True


def is_peer_lost(err: BaseException) -> bool:
    """A collective that failed because another rank went away (gloo, NCCL, the store)."""
    text = str(err).lower()
    return any(words in text for words in (
        "connection closed by peer", "connection reset by peer", "connection refused", "broken pipe",
        "timed out", "timeout", "nccl", "gloo", "socket", "ncclremoteerror", "process group",
    ))
