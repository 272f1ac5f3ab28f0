"""Published drafter folders (specviz/drafters/published): checkpoints written here in each
layout (names, shapes and config keys of ../shared/FORMATS.md) load on tiny random Llama and
Qwen3 targets, decode greedily equal to `ar`, and give the logits of a reference forward written
below from the layouts' equations in plain torch; bad folders fail with one clear line; the
shipped drafters' exports load back and draft exactly what the shipped weights draft."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specviz import runner, strategies
from specviz.drafters.base import DrafterUnavailable
from specviz.engine.decode import GenSettings
from specviz.engine.sampling import SamplingParams

N_LAYERS, D, HEADS, KV, HD, FFN, THETA = 6, 64, 4, 2, 16, 96, 10_000.0
GREEDY = SamplingParams(temperature=0.0)


def _target(kind: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen3Config

    from specviz.models.loading import embedded_folder
    from specviz.models.target import Target
    torch.manual_seed(1)
    Config = LlamaConfig if kind == "llama" else Qwen3Config
    cfg = Config(vocab_size=49152, hidden_size=D, intermediate_size=128, num_hidden_layers=N_LAYERS,
                 num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD,
                 max_position_embeddings=512, tie_word_embeddings=True, rope_theta=THETA,
                 bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.requires_grad_(False)
    return Target(model, AutoTokenizer.from_pretrained(embedded_folder()), f"tiny-{kind}")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request):
    return _target(request.param)


# --- checkpoints in the published layouts -----------------------------------------------------
def _w(*shape, scale=0.05, gen=None):
    return torch.randn(*shape, generator=gen) * scale


def _norm(n, gen):
    return 1.0 + 0.1 * torch.randn(n, generator=gen)


def _layer(prefix: str, d_in: int, gen, qk: bool, input_norm: bool = True) -> dict:
    t = {f"{prefix}.self_attn.q_proj.weight": _w(HEADS * HD, d_in, gen=gen),
         f"{prefix}.self_attn.k_proj.weight": _w(KV * HD, d_in, gen=gen),
         f"{prefix}.self_attn.v_proj.weight": _w(KV * HD, d_in, gen=gen),
         f"{prefix}.self_attn.o_proj.weight": _w(D, HEADS * HD, gen=gen),
         f"{prefix}.mlp.gate_proj.weight": _w(FFN, D, gen=gen),
         f"{prefix}.mlp.up_proj.weight": _w(FFN, D, gen=gen),
         f"{prefix}.mlp.down_proj.weight": _w(D, FFN, gen=gen),
         f"{prefix}.post_attention_layernorm.weight": _norm(D, gen)}
    if input_norm:
        t[f"{prefix}.input_layernorm.weight"] = _norm(D, gen)
    if qk:
        t[f"{prefix}.self_attn.q_norm.weight"] = _norm(HD, gen)
        t[f"{prefix}.self_attn.k_norm.weight"] = _norm(HD, gen)
    return t


def _geometry(target) -> dict:
    return {"hidden_size": D, "intermediate_size": FFN, "num_attention_heads": HEADS,
            "num_key_value_heads": KV, "head_dim": HD, "rms_norm_eps": 1e-6, "rope_theta": THETA,
            "vocab_size": target.vocab, "model_type": target.model.config.model_type}


def _write(folder, config: dict, tensors: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return str(folder)


EAGLE3_IDS = [1, 3, 4]              # input ids: hidden_states[i]
BLOCK_IDS = [0, 2, 4]               # output ids: hidden_states[i + 1]


def eagle3_folder(path, target, vd: int = 512) -> tuple[str, dict]:
    g = torch.Generator().manual_seed(3)
    draft = torch.randperm(target.vocab, generator=g)[:vd].sort().values
    t = {"fc.weight": _w(D, 3 * D, gen=g), "norm.weight": _norm(D, g),
         "midlayer.input_layernorm.weight": _norm(D, g), "midlayer.hidden_norm.weight": _norm(D, g),
         "lm_head.weight": _w(vd, D, scale=0.5, gen=g), "d2t": draft - torch.arange(vd),
         "t2d": torch.zeros(target.vocab, dtype=torch.bool).index_fill(0, draft, True)}
    t |= _layer("midlayer", 2 * D, g, qk=False, input_norm=False)
    cfg = _geometry(target) | {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                               "num_hidden_layers": 1, "draft_vocab_size": vd,
                               "tie_word_embeddings": False,
                               "eagle_aux_hidden_state_layer_ids": EAGLE3_IDS}
    return _write(path, cfg, t), t


def eagle1_folder(path, target) -> tuple[str, dict]:
    g = torch.Generator().manual_seed(4)
    t = {"fc.weight": _w(D, 2 * D, gen=g), "fc.bias": _w(D, gen=g)}
    t |= _layer("layers.0", D, g, qk=False, input_norm=False)
    cfg = _geometry(target) | {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                               "num_hidden_layers": 1, "bias": True}
    return _write(path, cfg, t), t


def dflash_folder(path, target, block: int = 6, layers: int = 2, mask: int = 7) -> tuple[str, dict]:
    g = torch.Generator().manual_seed(5)
    qk = target.model.config.model_type == "qwen3"
    t = {"fc.weight": _w(D, 3 * D, gen=g), "hidden_norm.weight": _norm(D, g), "norm.weight": _norm(D, g)}
    for i in range(layers):
        t |= _layer(f"layers.{i}", D, g, qk=qk)
    cfg = _geometry(target) | {"architectures": ["DFlashDraftModel"], "num_hidden_layers": layers,
                               "num_target_layers": N_LAYERS, "block_size": block,
                               "dflash_config": {"mask_token_id": mask, "target_layer_ids": BLOCK_IDS}}
    return _write(path, cfg, t), t


def dspark_folder(path, target, block: int = 5, rank: int = 16, mask: int = 7) -> tuple[str, dict]:
    g = torch.Generator().manual_seed(6)
    qk = target.model.config.model_type == "qwen3"
    t = {"fc.weight": _w(D, 3 * D, gen=g), "hidden_norm.weight": _norm(D, g), "norm.weight": _norm(D, g),
         "markov_head.markov_w1.weight": _w(target.vocab, rank, scale=1.0, gen=g),
         "markov_head.markov_w2.weight": _w(target.vocab, rank, scale=0.5, gen=g),
         "confidence_head.proj.weight": _w(1, D + rank, scale=0.3, gen=g),
         "confidence_head.proj.bias": torch.tensor([1.5]),
         "embed_tokens.weight": target.embed.weight.detach().clone(),
         "lm_head.weight": target.lm_head.weight.detach().clone()}
    t |= _layer("layers.0", D, g, qk=qk)
    cfg = target.model.config.to_dict() | _geometry(target) | {
        "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 1, "block_size": block,
        "mask_token_id": mask, "target_layer_ids": BLOCK_IDS, "markov_rank": rank,
        "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True}
    return _write(path, cfg, t), t


# --- the reference forwards: the layouts' equations, plain torch --------------------------------
def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rot(x, pos):                                          # x [n, h, hd], Llama rotate-half RoPE
    inv = THETA ** (-torch.arange(0, HD, 2).float() / HD)
    ang = pos.float()[:, None] * inv                      # [n, hd/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    return x * cos + torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], -1) * sin


def attend(t, p, xq, xkv, qpos, kpos, causal: bool):
    """One attention: queries from xq, keys/values from xkv; q/k norms where the layer has them."""
    q = (xq @ t[f"{p}.self_attn.q_proj.weight"].T).view(len(xq), HEADS, HD)
    k = (xkv @ t[f"{p}.self_attn.k_proj.weight"].T).view(len(xkv), KV, HD)
    v = (xkv @ t[f"{p}.self_attn.v_proj.weight"].T).view(len(xkv), KV, HD)
    if f"{p}.self_attn.q_norm.weight" in t:
        q, k = rms(q, t[f"{p}.self_attn.q_norm.weight"]), rms(k, t[f"{p}.self_attn.k_norm.weight"])
    q, k = rot(q, qpos), rot(k, kpos)
    k, v = k.repeat_interleave(HEADS // KV, 1), v.repeat_interleave(HEADS // KV, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HD)
    if causal:
        s = s.masked_fill(kpos[None, None, :] > qpos[None, :, None], float("-inf"))
    o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(len(xq), -1)
    return o @ t[f"{p}.self_attn.o_proj.weight"].T


def mlp(t, p, h):
    x = rms(h, t[f"{p}.post_attention_layernorm.weight"])
    return h + (F.silu(x @ t[f"{p}.mlp.gate_proj.weight"].T) * (x @ t[f"{p}.mlp.up_proj.weight"].T)
                ) @ t[f"{p}.mlp.down_proj.weight"].T


def hidden_states(target, ids):
    with torch.no_grad():
        out = target.model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return [h[0].float() for h in out.hidden_states]     # [0] embeddings, [N] final normed


def ref_eagle3(t, target, ids):
    """Full-vocabulary logits (-inf off the draft vocabulary) of the last entry: entry i pairs
    fc(cat(hidden_states[a][i], ...)) with token i + 1."""
    hs, emb = hidden_states(target, ids), target.embed.weight.float()
    L = len(ids) - 1
    g = torch.cat([hs[i][:L] for i in EAGLE3_IDS], -1) @ t["fc.weight"].T
    x = torch.cat([rms(emb[ids[1:]], t["midlayer.input_layernorm.weight"]),
                   rms(g, t["midlayer.hidden_norm.weight"])], -1)
    pos = torch.arange(L)
    h = mlp(t, "midlayer", g + attend(t, "midlayer", x, x, pos, pos, True))
    logits = rms(h[-1], t["norm.weight"]) @ t["lm_head.weight"].T
    full = torch.full((target.vocab,), float("-inf"))
    full[torch.arange(len(t["d2t"])) + t["d2t"]] = logits
    return full


def ref_eagle1(t, target, ids):
    hs, emb = hidden_states(target, ids), target.embed.weight.float()
    L = len(ids) - 1
    x = torch.cat([emb[ids[1:]], hs[N_LAYERS][:L]], -1) @ t["fc.weight"].T + t["fc.bias"]
    pos = torch.arange(L)
    h = mlp(t, "layers.0", x + attend(t, "layers.0", x, x, pos, pos, True))
    return h[-1] @ target.lm_head.weight.float().T


def ref_block(t, target, ids, block: int, layers: int, mask: int):
    """Final normed block rows [block, d]: context = committed tokens (all but the root), block
    [root, mask x (block - 1)] at the next positions, non-causal."""
    hs, emb = hidden_states(target, ids), target.embed.weight.float()
    L = len(ids) - 1
    ctx = rms(torch.cat([hs[i + 1][:L] for i in BLOCK_IDS], -1) @ t["fc.weight"].T,
              t["hidden_norm.weight"])
    x = emb[[ids[-1]] + [mask] * (block - 1)]
    qpos, kpos = torch.arange(L, L + block), torch.arange(L + block)
    for i in range(layers):
        p = f"layers.{i}"
        xn = rms(x, t[f"{p}.input_layernorm.weight"])
        x = mlp(t, p, x + attend(t, p, xn, torch.cat([ctx, xn]), qpos, kpos, False))
    return rms(x, t["norm.weight"])


# --- helpers over our drafters ------------------------------------------------------------------
def _drafter(target, sid, path, **kw):
    """Our drafter of a published folder, in fp32: these tests compare layouts to 1e-4."""
    settings = {"path": path, "precision": "fp32"} | kw
    return strategies.drafter_for(target, sid, strategies.parse_settings(sid, settings))


def _state(target, drafter, ids):
    feats = {k: v[:-1] for k, v in target.forward(ids, target.new_cache(), taps=drafter.taps).taps.items()}
    return drafter.start(ids, feats)


PROMPT = [1, 504, 2260, 314, 253, 1345, 28, 2683, 418, 9714, 30]


def _greedy_equals_ar(target, sid, path, **kw):
    gen = GenSettings(max_new_tokens=12)
    ar = runner.generate(target, strategy="ar", prompt_ids=PROMPT, gen=gen)
    ours = runner.generate(target, strategy=sid, prompt_ids=PROMPT, gen=gen,
                           overrides={"path": path} | kw)
    assert ours.token_ids == ar.token_ids


# --- per layout ---------------------------------------------------------------------------------
def test_eagle3_layout(tiny, tmp_path):
    from specviz.drafters import feature_heads as fh
    from specviz.drafters.layers import widen
    path, t = eagle3_folder(tmp_path / "e3", tiny)
    drafter = _drafter(tiny, "eagle3", path)
    state = _state(tiny, drafter, PROMPT)
    out, logits = fh.catch_up(drafter.head, state, PROMPT[-1])
    ours = widen(logits[0], drafter.head.vocab_ids, tiny.vocab)
    ref = ref_eagle3(t, tiny, PROMPT)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    torch.testing.assert_close(ours[~torch.isinf(ref)], ref[~torch.isinf(ref)], atol=1e-4, rtol=1e-4)
    _greedy_equals_ar(tiny, "eagle3", path)
    _greedy_equals_ar(tiny, "eagle3", path, mode="chain")


def test_eagle1_layout(tiny, tmp_path):
    from specviz.drafters import feature_heads as fh
    path, t = eagle1_folder(tmp_path / "e1", tiny)
    drafter = _drafter(tiny, "eagle2", path)
    _, logits = fh.catch_up(drafter.head, _state(tiny, drafter, PROMPT), PROMPT[-1])
    torch.testing.assert_close(logits[0], ref_eagle1(t, tiny, PROMPT), atol=1e-4, rtol=1e-4)
    _greedy_equals_ar(tiny, "eagle1", path)
    _greedy_equals_ar(tiny, "eagle2", path)


def test_dflash_layout(tiny, tmp_path):
    path, t = dflash_folder(tmp_path / "df", tiny)
    drafter = _drafter(tiny, "dflash", path, auto_budget="false")   # the whole block, not timed
    assert drafter.block == 6 and drafter.taps == tuple(i + 1 for i in BLOCK_IDS)
    h = drafter.block_hidden(_state(tiny, drafter, PROMPT), tiny.embed, PROMPT[-1], 6)
    ref = ref_block(t, tiny, PROMPT, 6, 2, 7)
    torch.testing.assert_close(h.float(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(drafter.head.full(drafter.head.logits(h[1:])),
                               ref[1:] @ tiny.lm_head.weight.float().T, atol=1e-3, rtol=1e-4)
    tree = drafter.draft(_state(tiny, drafter, PROMPT), PROMPT[-1], GREEDY, None)
    assert tree.tokens[1:] == (ref[1:] @ tiny.lm_head.weight.float().T).argmax(-1).tolist()
    _greedy_equals_ar(tiny, "dflash", path)


def test_dspark_layout(tiny, tmp_path):
    path, t = dspark_folder(tmp_path / "ds", tiny)
    drafter = _drafter(tiny, "dspark", path, scheduler="threshold", threshold="0.0")
    assert drafter.model.block == 5 and drafter.settings.block_size == 5   # capped at the checkpoint's
    tree = drafter.draft(_state(tiny, drafter, PROMPT), PROMPT[-1], GREEDY, None)
    h = ref_block(t, tiny, PROMPT, 5, 1, 7)
    w1, w2 = t["markov_head.markov_w1.weight"], t["markov_head.markov_w2.weight"]
    prev, toks, confs = PROMPT[-1], [], []
    for k in range(5):                                   # all rows draft; the anchor's too
        e = w1[prev]
        confs.append(torch.sigmoid(torch.cat([h[k], e]) @ t["confidence_head.proj.weight"][0]
                                   + t["confidence_head.proj.bias"][0]).item())
        prev = int((h[k] @ tiny.lm_head.weight.float().T + e @ w2.T).argmax())
        toks.append(prev)
    assert tree.tokens[1:] == toks
    assert tree.confidence[1:] == pytest.approx(confs, abs=1e-4)
    _greedy_equals_ar(tiny, "dspark", path)


# --- bad folders: one clear line each -----------------------------------------------------------
def _fails(target, sid, path, *needles):
    with pytest.raises(DrafterUnavailable) as err:
        _drafter(target, sid, str(path))
    msg = str(err.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_bad_folders(tmp_path, monkeypatch):
    target = _target("llama")
    path, t = dflash_folder(tmp_path / "ok", target)
    _write(tmp_path / "missing", json.loads((tmp_path / "ok/config.json").read_text()),
           {k: v for k, v in t.items() if k != "layers.1.mlp.up_proj.weight"})
    _fails(target, "dflash", tmp_path / "missing", "missing tensors", "layers.1.mlp.up_proj.weight")
    _write(tmp_path / "shape", json.loads((tmp_path / "ok/config.json").read_text()),
           t | {"norm.weight": torch.ones(D + 1)})
    _fails(target, "dflash", tmp_path / "shape", "norm.weight", f"[{D + 1}]", f"[{D}]")
    other = json.loads((tmp_path / "ok/config.json").read_text()) | {"hidden_size": 2 * D}
    _write(tmp_path / "target", other, t)
    _fails(target, "dflash", tmp_path / "target", "hidden size", str(2 * D), str(D))
    deep = json.loads((tmp_path / "ok/config.json").read_text())
    deep["dflash_config"]["target_layer_ids"] = [0, 2, 40]
    _write(tmp_path / "layers", deep | {"num_target_layers": None}, t)
    _fails(target, "dflash", tmp_path / "layers", "40", f"{N_LAYERS} layers")
    _write(tmp_path / "arch", {"architectures": ["MedusaModel"], "num_hidden_layers": 3}, t)
    _fails(target, "dflash", tmp_path / "arch", "unknown architecture", "MedusaModel")
    (tmp_path / "noconfig").mkdir()
    _fails(target, "dflash", tmp_path / "noconfig", "no config.json")
    _fails(target, "eagle3", tmp_path / "ok", "DFlash drafter", "strategy eagle3 needs EAGLE-3")
    _fails(target, "dflash", tmp_path / "nowhere", "not found")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    _fails(target, "dflash", "nobody-here/no-such-drafter", "cannot fetch", "hub")
    with pytest.raises(ValueError, match="no setting 'path'"):
        strategies.parse_settings("ngram", {"path": path})


# --- export -> import on the embedded model ------------------------------------------------------
# timing-free settings: the cost-model budgets would cut trees by measured time
@pytest.mark.parametrize("drafter_id,sid,kw", [
    ("eagle3", "eagle3", {"auto_budget": "false"}), ("dflash-b16", "dflash", {"auto_budget": "false"}),
    ("eagle1", "eagle2", {"auto_budget": "false"}), ("dspark", "dspark", {"scheduler": "threshold"})])
def test_export_round_trip(target, tmp_path, drafter_id, sid, kw):
    from specviz.drafters.published.export import export
    report = export(drafter_id, tmp_path / drafter_id, target)
    files = {p.name for p in (tmp_path / drafter_id).iterdir()}
    assert set(report["files"]) == files and report["differences"]
    assert report["speculative_config"]["model"] == report["path"]
    index = json.loads((tmp_path / drafter_id / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model.safetensors"}   # engines skip the extras
    shipped = strategies.drafter_for(target, sid,
                                     strategies.parse_settings(sid, kw | {"precision": "fp32"}))
    loaded = _drafter(target, sid, report["path"], **kw)
    for ids in (target.encode("Name three colours."), target.encode("What is 12 times 7?")):
        a = shipped.draft(_state(target, shipped, ids), ids[-1], GREEDY, None)
        b = loaded.draft(_state(target, loaded, ids), ids[-1], GREEDY, None)
        assert (a.tokens, a.parents) == (b.tokens, b.parents) and len(a.tokens) > 1
