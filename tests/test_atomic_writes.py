"""Faults around the atomic writes of beam_sft.storage: permissions under the umask, kill -9 mid-run, stale temporaries.

Every output — `convert-dataset` outputs (JSONL, Parquet, save_to_disk), `--rejects`, `--stats`, and whatever
goes through `atomic_output` — must get the permissions any new file gets under the user's umask (a temporary
file's private 0600 must not survive the rename), must never appear partially under its final name, and the
temporaries of a killed run must be recognised and removed by the next run on the same output, without
touching those of a run still alive.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from beam_sft.cli.convert import main
from beam_sft.storage import (
    HOST,
    atomic_output,
    remove_stale_temporaries,
    temporary_path,
    write_json_atomic,
)

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "samples"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _temporaries(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if ".beam-tmp-" in p.name)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_every_output_gets_the_umask_permissions(tmp_path, capsys, umask, mask, file_mode, dir_mode):
    umask(mask)
    inputs = [SAMPLES / "openai.jsonl", SAMPLES / "harmony.jsonl"]
    outs = {kind: tmp_path / name for kind, name in (("jsonl", "o.jsonl"), ("parquet", "o.parquet"),
                                                     ("disk", "o_ds"))}
    for kind, out in outs.items():
        rej, stats = tmp_path / f"rej_{kind}.jsonl", tmp_path / f"stats_{kind}.json"
        argv = [*map(str, inputs), "-o", str(out), "--rejects", str(rej), "--stats", str(stats), "-q",
                "--render-check", "none"]
        assert main(argv) == 0, capsys.readouterr().err
        assert _mode(rej) == file_mode and _mode(stats) == file_mode
    assert _mode(outs["jsonl"]) == file_mode and _mode(outs["parquet"]) == file_mode
    ds_files = [p for p in outs["disk"].rglob("*") if p.is_file()]
    assert len(ds_files) >= 3  # data, dataset_info.json, state.json
    assert {_mode(p) for p in ds_files} == {file_mode}
    assert _mode(outs["disk"]) == dir_mode
    # a second run replaces each output with a fresh file: still the umask's mode
    assert main([str(inputs[0]), "-o", str(outs["disk"]), "-q", "--render-check", "none"]) == 0
    assert {_mode(p) for p in outs["disk"].rglob("*") if p.is_file()} == {file_mode}
    # the exported helper (for other writers such as `beam-sft prepare`) and inspect's HTML page do the same
    with atomic_output(tmp_path / "prepared", directory=True) as tmp:
        (tmp / "part-0.arrow").write_bytes(b"x")
    with atomic_output(tmp_path / "one.bin") as tmp:
        tmp.write_bytes(b"y")
    from beam_sft.storage import write_text_atomic

    write_text_atomic(tmp_path / "page.html", "<html></html>")
    assert _mode(tmp_path / "prepared") == dir_mode and _mode(tmp_path / "prepared" / "part-0.arrow") == file_mode
    assert _mode(tmp_path / "one.bin") == file_mode and _mode(tmp_path / "page.html") == file_mode
    assert _temporaries(tmp_path) == []


def test_atomic_output_leaves_nothing_on_error_and_keeps_the_old_output(tmp_path):
    target = tmp_path / "out.json"
    write_json_atomic(str(target), {"a": 1})
    with pytest.raises(RuntimeError), atomic_output(target) as tmp:
        tmp.write_bytes(b'{"partial')
        raise RuntimeError("writer died")
    assert orjson.loads(target.read_bytes()) == {"a": 1} and _temporaries(tmp_path) == []
    with pytest.raises(RuntimeError), atomic_output(tmp_path / "ds", directory=True) as tmp:
        (tmp / "f").write_bytes(b"x")
        raise RuntimeError("writer died")
    assert not (tmp_path / "ds").exists() and _temporaries(tmp_path) == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_stale_temporaries_of_this_host_are_removed(tmp_path):
    target = tmp_path / "out.jsonl"
    dead = _dead_pid()
    stale_file = tmp_path / f".out.jsonl.beam-tmp-{HOST}-{dead}-0a0a0a0a"
    stale_dir = tmp_path / f".out.jsonl.beam-tmp-{HOST}-{dead}-0b0b0b0b"
    alive = tmp_path / f".out.jsonl.beam-tmp-{HOST}-{os.getppid()}-0c0c0c0c"  # a live process: another run
    other_host = tmp_path / f".out.jsonl.beam-tmp-otherhost-{dead}-0d0d0d0d"  # its PID means nothing here
    other_output = tmp_path / f".other.jsonl.beam-tmp-{HOST}-{dead}-0e0e0e0e"
    for p in (stale_file, alive, other_host, other_output):
        p.write_bytes(b"x")
    stale_dir.mkdir()
    (stale_dir / "cache").write_bytes(b"x")
    removed = remove_stale_temporaries(target)
    assert sorted(removed) == sorted([stale_file, stale_dir])
    assert alive.exists() and other_host.exists() and other_output.exists()
    mine = temporary_path(target)
    assert mine.name.startswith(f".out.jsonl.beam-tmp-{HOST}-{os.getpid()}-")
    assert remove_stale_temporaries(target) == [] and mine.exists()  # never our own


def _big_input(path: Path, n: int) -> int:
    lines = [line for line in (SAMPLES / "openai.jsonl").read_bytes().splitlines() if line.strip()]
    with open(path, "wb") as f:
        f.writelines(lines[i % len(lines)] + b"\n" for i in range(n))
    return n


def test_kill_9_mid_run_then_rerun(tmp_path):
    """A run killed with SIGKILL leaves only recognisable temporaries, never a partial output under the final
    name; the next run on the same output removes them and writes the complete output."""
    src = tmp_path / "big.jsonl"
    n = _big_input(src, 20000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    out.write_bytes(b"previous complete output\n")
    argv = [sys.executable, "-m", "beam_sft.cli.convert", str(src), "-o", str(out), "--rejects", str(rej), "-q",
            "--dedup", "false",  # the input repeats a few records: all of them written, so the output grows
            "--render-check", "all"]  # rendering every record makes the run slow enough to kill mid-way
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BEAM_SFT_DEBUG": ""}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    # wait until the run is writing: its temporary output has data in it (the writer flushes every 1 MiB)
    while time.monotonic() < deadline and proc.poll() is None:
        tmps = [p for p in _temporaries(tmp_path) if p.name.startswith(".out.jsonl")]
        if tmps and tmps[0].stat().st_size > 0:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; make the input bigger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = _temporaries(tmp_path)
    assert {p.name.split(".beam-tmp-")[0] for p in left} == {".out.jsonl", ".rej.jsonl"}
    assert all(f"-{proc.pid}-" in p.name for p in left)
    assert out.read_bytes() == b"previous complete output\n" and not rej.exists()  # nothing partial visible

    rerun = subprocess.run([*argv[:-2], "--render-check", "none"], env=env, capture_output=True, timeout=300,
                           check=False)
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert _temporaries(tmp_path) == []
    n_out = len(out.read_bytes().splitlines())
    n_rej = len(rej.read_bytes().splitlines())
    assert n_out + n_rej == n and n_out > 0


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ""])
def test_every_output_creates_its_parent_directory(tmp_path, suffix):
    """`convert-dataset -o new/dir/x.jsonl` (and its --rejects, --stats) creates new/dir, like `prepare` does;
    the atomic writer does it, so every command that writes through it does too."""
    out = tmp_path / "new" / "dir" / f"beam{suffix or '_ds'}"
    rejects, stats = tmp_path / "r" / "rejects.jsonl", tmp_path / "s" / "deep" / "stats.json"
    code = main([str(SAMPLES / "openai.jsonl"), "-o", str(out), "--rejects", str(rejects), "--stats", str(stats),
                 "-q", "--render-check", "none"])
    assert code == 0 and out.exists() and rejects.is_file() and stats.is_file()
    assert orjson.loads(stats.read_bytes())["records_out"] > 0
    write_json_atomic(str(tmp_path / "a" / "b" / "c.json"), {"x": 1})
    assert orjson.loads((tmp_path / "a" / "b" / "c.json").read_bytes()) == {"x": 1}
    with atomic_output(tmp_path / "d" / "e" / "f", directory=True) as tmp:
        (tmp / "part").write_bytes(b"x")
    assert (tmp_path / "d" / "e" / "f" / "part").read_bytes() == b"x"
    assert not [p for p in tmp_path.rglob("*") if ".beam-tmp-" in p.name]


def test_cache_entries_and_their_keys(tmp_path, monkeypatch):
    """The cache directory follows $BEAM_SFT_CACHE; a key is the sha256 of its parts in order; an entry that
    cannot be written (a read-only cache) is skipped, not an error."""
    import hashlib

    from beam_sft.storage import cache_dir, files_digest, short_hash, write_cache_file

    monkeypatch.setenv("BEAM_SFT_CACHE", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("BEAM_SFT_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "beam_sft"
    assert short_hash("ab", b"c") == short_hash("abc") == hashlib.sha256(b"abc").hexdigest()[:16]
    assert len(short_hash("abc", length=32)) == 32
    assert write_cache_file(tmp_path / "cache" / "entry.bin", b"data")
    assert (tmp_path / "cache" / "entry.bin").read_bytes() == b"data"
    (tmp_path / "cache" / "other").write_bytes(b"x")
    before = files_digest(tmp_path / "cache")
    (tmp_path / "cache" / "other").write_bytes(b"y")
    assert files_digest(tmp_path / "cache") != before
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "cache").chmod(0o555)
        try:
            assert not write_cache_file(tmp_path / "cache" / "new.bin", b"data")
        finally:
            (tmp_path / "cache").chmod(0o755)
