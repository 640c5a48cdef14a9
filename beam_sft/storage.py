"""Where beam_sft keeps things on disk: the cache directory, the hashes cache entries and fingerprints are keyed
by, atomic writes (outputs and cache files alike, so no reader ever sees half of one), and the Arrow columns the
data pipeline writes. See docs/formats.md#outputs-are-atomic."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


def cache_dir() -> Path:
    """The directory for what later processes may reuse (tiktoken ranks, regex-engine checks): `$BEAM_SFT_CACHE`,
    else ~/.cache/beam_sft. Anything in it can be deleted; it is built again when needed."""
    return Path(os.environ.get("BEAM_SFT_CACHE") or Path.home() / ".cache" / "beam_sft")


def short_hash(*parts: str | bytes, length: int = 16) -> str:
    """The sha256 of `parts` (str as UTF-8), fed one after another, as `length` hex digits: the one hash that
    cache keys and fingerprints are made of. Parts are not separated: put separators in the text."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
    return digest.hexdigest()[:length]


def files_digest(directory: str | Path) -> str:
    """sha256 of a directory's files (names and bytes, in name order), as 64 hex digits."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(directory).iterdir() if p.is_file()):
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def package_version(name: str) -> str | None:
    """The installed version of the distribution `name` (None if absent): part of cache keys."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# --- atomic writes ---------------------------------------------------------------------------------------------

# Temporaries are `.NAME.beam-tmp-HOST-PID-RANDOM[.suffix]` beside NAME: HOST and PID say whose they are, so
# only a dead process's of this host are removed (docs/formats.md#outputs-are-atomic).
TMP_TAG = ".beam-tmp-"
HOST = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname()) or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(target: str | os.PathLike) -> list[Path]:
    """Remove the temporaries a killed run left beside `target` (see TMP_TAG); return what was removed."""
    target = Path(target)
    pattern = re.compile(rf"^\.{re.escape(target.name)}{re.escape(TMP_TAG)}(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-")
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or m["host"] != HOST or int(m["pid"]) == os.getpid() or _pid_alive(int(m["pid"])):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def temporary_path(target: str | os.PathLike, suffix: str = "", *, directory: bool = False) -> Path:
    """A new, empty file (or directory) beside `target`, named as above, with the permissions any new file gets
    under the umask (not `mkstemp`'s 0600, which would survive the rename). `target`'s directory is created
    when missing: every command that writes an output goes through here, so none fails on a new directory."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = target.with_name(f".{target.name}{TMP_TAG}{HOST}-{os.getpid()}-{secrets.token_hex(4)}{suffix}")
        try:
            if directory:
                os.mkdir(path, 0o777)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free temporary name beside {target}")


def fresh_temporary(target: str | os.PathLike, suffix: str = "", *, directory: bool = False) -> Path:
    """`temporary_path`, after removing what killed runs left beside `target`: the start of every atomic write."""
    remove_stale_temporaries(target)
    return temporary_path(target, suffix, directory=directory)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a closed file's bytes to disk, so the rename that publishes it never shows an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_dir(src: Path, target: Path) -> None:
    """Move the finished directory `src` to `target`, replacing a previous one (never merging into it)."""
    old = None
    if target.exists():
        old = temporary_path(target, ".old", directory=True)
        os.replace(target, old)  # an empty directory may be replaced by a rename
    try:
        os.replace(src, target)
    except OSError:
        if old is not None:  # put the previous output back rather than leave nothing under the name
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str = "", *, directory: bool = False) -> Iterator[Path]:
    """Yields a temporary path beside `path` (a directory with ``directory=True``), renamed to `path` when the
    block ends without an exception, removed on one: docs/formats.md#outputs-are-atomic."""
    target = Path(path)
    tmp = fresh_temporary(target, suffix, directory=directory)
    try:
        yield tmp
        if directory:
            replace_dir(tmp, target)
        else:
            fsync_file(tmp)
            os.replace(tmp, target)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically: an HTML page, a report."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_bytes_atomic(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")


def write_cache_file(path: Path, data: bytes) -> bool:
    """Store a cache entry atomically; False when the cache cannot be written (a read-only home): the caller
    computes the entry again next time."""
    try:
        write_bytes_atomic(path, data)
    except OSError:
        return False
    return True


def arrow_array(values: Any, type_: Any) -> Any:
    """`pyarrow.array(values, type_)` for the data pipeline's columns (ints, bools, strings, bytes), built from
    numpy buffers where no value is missing: pyarrow's conversion of Python objects imports pandas on first use
    (0.3-0.45 CPU-s, a third of a small `beam-sft prepare`'s fixed cost) and copies bytes one object at a time
    (11 µs a raw JSON line against 0.24 from one joined buffer; issue 52's profile of the raw workload)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(values, list) and values and None in values:
        return pa.nulls(len(values), type_) if values.count(None) == len(values) else pa.array(values, type_)
    if type_ in (pa.large_binary(), pa.string()):
        chunks = values if type_ == pa.large_binary() else [value.encode("utf-8") for value in values]
        offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks)), out=offsets[1:])
        if type_ == pa.string():
            if offsets[-1] >= 2**31:  # over what one string array's int32 offsets hold
                return pa.array(values, type_)
            offsets = offsets.astype(np.int32)
        return pa.Array.from_buffers(type_, len(chunks), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(chunks))])
    if type_ == pa.bool_():
        bits = np.packbits(np.asarray(values, dtype=bool), bitorder="little")
        return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(bits)])
    numbers = np.ascontiguousarray(values, dtype={pa.int32(): np.int32, pa.int64(): np.int64}[type_])
    return pa.Array.from_buffers(type_, len(numbers), [None, pa.py_buffer(numbers)])


def numpy_ints(array: Any) -> Any:
    """An Arrow int32 / int64 array without nulls as a numpy view (`Array.to_numpy` imports pandas too)."""
    import numpy as np

    dtype = np.dtype(np.int32 if array.type.bit_width == 32 else np.int64)
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
