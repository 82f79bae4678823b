#!/usr/bin/python3
"""Runs a Hugging Face model directory the way the transformers library defines
GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and
DeepseekV3ForCausalLM, in float64 PyTorch,
from config.json and the safetensors files alone (written for megatron-cpp's
export tests; transformers itself is not packaged in Debian).

usage:
  hf_reference.py DIR logits IN.safetensors OUT.safetensors
      IN holds "tokens" [B, T] int32; OUT gets "logits" [T*B, vocab] float32
      in Megatron's [s, b] row order (row t*B + b), and with DeepSeek-V3's
      multi-token prediction layers "mtp_logits.{k}" the same way.
  hf_reference.py DIR greedy "ID ID ..." N
      prints the prompt's greedy continuation: up to N ids, stopping before
      eos_token_id (as megatron generate does), on one line.
Exit code 77 when torch is not installed.
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"hf_reference.py: {e}; install python3-torch python3-numpy", file=sys.stderr)
    sys.exit(77)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "BF16":  # numpy has no bfloat16: widen the 16 bits to float32's upper half
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif t["dtype"] == "F16":  # IEEE half, widened exactly
            arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
        else:
            arr = np.frombuffer(raw, dtype={"F32": np.float32, "F64": np.float64, "I32": np.int32}[t["dtype"]])
        out[name] = torch.from_numpy(arr.reshape(t["shape"]).copy())
    return out


def load_model_dir(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(d, "model.safetensors.index.json")
    W = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for fn in files:
        W.update(read_safetensors(os.path.join(d, fn)))
    return cfg, {k: v.double() for k, v in W.items()}


def causal_attention(q, k, v):  # [B, H, T, D]
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def gpt2(cfg, W, ids):
    B, T = ids.shape
    E, H = cfg["n_embd"], cfg["n_head"]
    D = E // H
    eps = cfg["layer_norm_epsilon"]
    act = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
           "relu2": lambda x: torch.square(F.relu(x))}[cfg["activation_function"]]
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        ln = lambda t, n: F.layer_norm(t, (E,), W[p + n + ".weight"], W[p + n + ".bias"], eps)
        conv = lambda t, n: t @ W[p + n + ".weight"] + W[p + n + ".bias"]  # Conv1D: [in, out]
        q, k, v = conv(ln(x, "ln_1"), "attn.c_attn").split(E, dim=-1)
        heads = lambda t: t.view(B, T, H, D).transpose(1, 2)
        y = causal_attention(heads(q), heads(k), heads(v)).transpose(1, 2).reshape(B, T, E)
        x = x + conv(y, "attn.c_proj")
        x = x + conv(act(conv(ln(x, "ln_2"), "mlp.c_fc")), "mlp.c_proj")
    x = F.layer_norm(x, (E,), W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    head = W["transformer.wte.weight"] if cfg.get("tie_word_embeddings", True) else W["lm_head.weight"]
    return x @ head.t()


def rope_inv_freq(cfg, D):
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"]
    assert kind == "llama3", kind
    factor, low, high, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, out)


def llama(cfg, W, ids):
    B, T = ids.shape
    E, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or (128 if cfg["model_type"] == "qwen3" else E // H)
    eps = cfg["rms_norm_eps"]
    mlp_bias = cfg.get("mlp_bias", False)

    def rms(t, w):
        return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps))

    def lin(t, n, bias):
        y = t @ W[n + ".weight"].t()
        return y + W[n + ".bias"] if bias else y

    ang = torch.outer(torch.arange(T, dtype=torch.float64), rope_inv_freq(cfg, D))
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(t):
        a, b = t[..., : D // 2], t[..., D // 2:]
        return torch.cat((-b, a), dim=-1)

    x = W["model.embed_tokens.weight"][ids]
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False) or \
        (cfg["model_type"] == "qwen2_moe" and cfg.get("qkv_bias", True))
    o_bias = cfg["model_type"] in ("llama", "qwen3") and cfg.get("attention_bias", False)
    # Qwen3Attention (Qwen3-MoE's too): RMSNorm over each q and k head, before RoPE.
    qk_norm = cfg["model_type"] in ("qwen3", "qwen3_moe")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj", qkv_bias).view(B, T, H, D).transpose(1, 2)
        k = lin(h, p + "self_attn.k_proj", qkv_bias).view(B, T, KV, D).transpose(1, 2)
        v = lin(h, p + "self_attn.v_proj", qkv_bias).view(B, T, KV, D).transpose(1, 2)
        if qk_norm:
            q = rms(q, W[p + "self_attn.q_norm.weight"])
            k = rms(k, W[p + "self_attn.k_norm.weight"])
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # query head j reads key/value head j // (H / KV)
        v = v.repeat_interleave(H // KV, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
        x = x + lin(y, p + "self_attn.o_proj", o_bias)
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        if cfg["model_type"] == "mixtral":
            x = x + sparse_moe(cfg, W, p + "block_sparse_moe.", h, cfg["num_local_experts"], True,
                               ("w1", "w3", "w2"))
            continue
        # Qwen2-/Qwen3-MoE: layer i is sparse unless listed in mlp_only_layers,
        # every decoder_sparse_step-th layer (i + 1 divisible by it); Qwen2-MoE
        # adds its shared expert times sigmoid(shared_expert_gate(x)).
        if cfg["model_type"] in ("qwen2_moe", "qwen3_moe") and i not in (cfg.get("mlp_only_layers") or []) and \
                cfg.get("num_experts", 1) > 0 and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0:
            x = x + sparse_moe(cfg, W, p + "mlp.", h, cfg["num_experts"], cfg.get("norm_topk_prob", False),
                               ("gate_proj", "up_proj", "down_proj"))
            if cfg["model_type"] == "qwen2_moe":
                s = p + "mlp.shared_expert."
                y = lin(F.silu(lin(h, s + "gate_proj", False)) * lin(h, s + "up_proj", False), s + "down_proj", False)
                x = x + torch.sigmoid(lin(h, p + "mlp.shared_expert_gate", False)) * y
            continue
        g = lin(h, p + "mlp.gate_proj", mlp_bias)
        u = lin(h, p + "mlp.up_proj", mlp_bias)
        x = x + lin(F.silu(g) * u, p + "mlp.down_proj", mlp_bias)
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return x @ head.t()


def sparse_moe(cfg, W, p, h, experts, renormalise, names):
    """Mixtral's and Qwen3-MoE's sparse MoE block: softmax over all experts'
    router logits, the top num_experts_per_tok, renormalised to sum to 1
    (Mixtral; Qwen3-MoE with norm_topk_prob) or not; each chosen expert's
    down(silu(gate x) * up x), weighted and summed. names: the expert's
    (gate, up, down) projections."""
    B, T, E = h.shape
    x = h.reshape(B * T, E)
    probs = torch.softmax(x @ W[p + "gate.weight"].t(), dim=-1)
    top, idx = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
    if renormalise:
        top = top / top.sum(dim=-1, keepdim=True)
    gate, up, down = names
    out = torch.zeros_like(x)
    for e in range(experts):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        q = f"{p}experts.{e}."
        xe = x[rows]
        y = (F.silu(xe @ W[q + gate + ".weight"].t()) * (xe @ W[q + up + ".weight"].t())) @ W[q + down + ".weight"].t()
        out = out.index_add(0, rows, top[rows, slot].unsqueeze(1) * y)
    return out.reshape(B, T, E)


def yarn_get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


MTP_LOGITS = []  # DeepseekV3ForCausalLM's multi-token prediction logits of the last forward, per depth


def deepseek_v3(cfg, W, ids):
    """DeepseekV3ForCausalLM as transformers defines it: multi-latent attention
    (q through q_a_proj, q_a_layernorm (eps 1e-6), q_b_proj, or q_proj; the
    compressed kv and the shared rope key from kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj), rope on the last qk_rope_head_dim dims with
    rope_interleave (each head's pairs (2i, 2i+1) regrouped as [evens, odds]
    before rotate-half), YaRN from rope_scaling (the factor taken as
    max_position_embeddings / original_max_position_embeddings, the attention
    factor get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) when both are
    set, else get_mscale(f); the softmax scale times get_mscale(f,
    mscale_all_dim)^2 when mscale_all_dim is set); the first
    first_k_dense_replace layers' MLPs dense, the others DeepseekV3MoE."""
    B, T = ids.shape
    E, H = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv, kl = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    eps = cfg["rms_norm_eps"]

    def rms(t, w, e=eps):
        return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + e))

    def lin(t, n):
        return t @ W[n + ".weight"].t()

    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dr, 2, dtype=torch.float64) / dr))
    attn_factor, scale = 1.0, (dn + dr) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs is not None:
        assert rs.get("rope_type", rs.get("type")) == "yarn", rs
        orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        f = cfg["max_position_embeddings"] / orig if "original_max_position_embeddings" in rs else rs["factor"]
        m, mad = rs.get("mscale"), rs.get("mscale_all_dim")
        attn_factor = yarn_get_mscale(f, m) / yarn_get_mscale(f, mad) if (m and mad) else yarn_get_mscale(f)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr(rot):
            return (dr * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(cfg["rope_theta"]))
        low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dr - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dr // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extra_mask = 1 - ramp
        inv = (inv / f) * (1 - extra_mask) + inv * extra_mask
        if rs.get("mscale_all_dim"):
            scale = scale * yarn_get_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos() * attn_factor, emb.sin() * attn_factor

    def rope(t):  # [B, h, T, dr]
        if cfg.get("rope_interleave", True):
            b, h, s, d = t.shape
            t = t.reshape(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
        a, b2 = t[..., : dr // 2], t[..., dr // 2:]
        return t * cos + torch.cat((-b2, a), dim=-1) * sin

    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def layer(x, i):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = rms(x, W[p + "input_layernorm.weight"])
        if cfg.get("q_lora_rank"):
            q = lin(rms(lin(h, a + "q_a_proj"), W[a + "q_a_layernorm.weight"], 1e-6), a + "q_b_proj")
        else:
            q = lin(h, a + "q_proj")
        q = q.view(B, T, H, dn + dr).transpose(1, 2)
        q_pass, q_rot = q[..., :dn], q[..., dn:]
        ckv = lin(h, a + "kv_a_proj_with_mqa")
        k_pass, k_rot = ckv[..., :kl], ckv[..., kl:]
        kv = lin(rms(k_pass, W[a + "kv_a_layernorm.weight"], 1e-6), a + "kv_b_proj").view(B, T, H, dn + dv).transpose(1, 2)
        k_pass, v = kv[..., :dn], kv[..., dn:]
        k_rot = rope(k_rot.view(B, 1, T, dr)).expand(B, H, T, dr)
        q = torch.cat((q_pass, rope(q_rot)), dim=-1)
        k = torch.cat((k_pass, k_rot), dim=-1)
        sc = (q @ k.transpose(-1, -2)) * scale
        y = torch.softmax(sc.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + lin(y.transpose(1, 2).reshape(B, T, H * dv), a + "o_proj")
        h = rms(x, W[p + "post_attention_layernorm.weight"])

        def mlp(t, q):
            return lin(F.silu(lin(t, q + "gate_proj")) * lin(t, q + "up_proj"), q + "down_proj")
        if i < cfg["first_k_dense_replace"]:
            return x + mlp(h, p + "mlp.")
        # DeepseekV3MoE: sigmoid scores; the choice adds e_score_correction_bias
        # and keeps topk_group of n_group groups ranked by their top-2 sums.
        hs = h.reshape(B * T, E)
        scores = torch.sigmoid(hs @ W[p + "mlp.gate.weight"].t())
        choice = scores + W[p + "mlp.gate.e_score_correction_bias"]
        G, Ne = cfg["n_group"], cfg["n_routed_experts"]
        gs = choice.view(-1, G, Ne // G).topk(2, dim=-1)[0].sum(-1)
        gidx = torch.topk(gs, k=cfg["topk_group"], dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(-1, G, Ne // G).reshape(-1, Ne)
        idx = torch.topk(choice.masked_fill(~smask.bool(), 0.0), k=cfg["num_experts_per_tok"], dim=-1, sorted=False)[1]
        wts = scores.gather(1, idx)
        if cfg.get("norm_topk_prob"):
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * cfg.get("routed_scaling_factor", 1.0)
        out = torch.zeros_like(hs)
        for e in range(Ne):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, wts[rows, slot].unsqueeze(1) * mlp(hs[rows], f"{p}mlp.experts.{e}."))
        return x + out.reshape(B, T, E) + mlp(h, p + "mlp.shared_experts.")

    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        x = layer(x, i)
    x = rms(x, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    logits = x @ head.t()
    # DeepSeek's multi-token prediction layers (num_nextn_predict_layers,
    # model.layers.{L + k}, as DeepSeek's and the inference engines' MTP
    # modules compute them): depth k embeds the tokens k ahead (the window
    # shifted left, 0 after its end) with its own embed_tokens, joins
    # [enorm(embedding), hnorm(previous hidden)] through eh_proj, runs its
    # layer, shared_head.norm and shared_head.head. The previous hidden is
    # the decoder's normed output, then each depth's normed one.
    MTP_LOGITS.clear()
    hk, tok = x, ids
    for k in range(cfg.get("num_nextn_predict_layers", 0)):
        i = cfg["num_hidden_layers"] + k
        p = f"model.layers.{i}."
        tok = torch.cat((tok[:, 1:], torch.zeros_like(tok[:, :1])), 1)
        e = W[p + "embed_tokens.weight"][tok]
        y = lin(torch.cat((rms(e, W[p + "enorm.weight"]), rms(hk, W[p + "hnorm.weight"])), -1), p + "eh_proj")
        hk = rms(layer(y, i), W[p + "shared_head.norm.weight"])
        MTP_LOGITS.append(hk @ W[p + "shared_head.head.weight"].t())
    return logits


def forward(cfg, W, ids):
    arch = cfg["architectures"][0]
    if arch == "DeepseekV3ForCausalLM":
        return deepseek_v3(cfg, W, ids)
    if arch == "GPT2LMHeadModel":
        return gpt2(cfg, W, ids)
    if arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                "Qwen3MoeForCausalLM"):
        return llama(cfg, W, ids)
    raise SystemExit(f"hf_reference.py: unknown architecture {arch}")


def write_logits(path, tensors):
    """tensors: {name: [rows, vocab]} written as F32."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.float().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    torch.set_num_threads(1)
    cfg, W = load_model_dir(sys.argv[1])
    mode = sys.argv[2]
    if mode == "logits":
        ids = read_safetensors(sys.argv[3])["tokens"].long()
        logits = forward(cfg, W, ids)  # [B, T, V]
        out = {"logits": logits.transpose(0, 1).reshape(-1, logits.shape[-1])}
        for k, lg in enumerate(MTP_LOGITS):  # "mtp_logits.{k}", the same [s, b] rows
            out[f"mtp_logits.{k}"] = lg.transpose(0, 1).reshape(-1, lg.shape[-1])
        write_logits(sys.argv[4], out)
    elif mode == "greedy":
        ids = [int(t) for t in sys.argv[3].split()]
        out = []
        for _ in range(int(sys.argv[4])):
            nxt = int(forward(cfg, W, torch.tensor([ids + out]))[0, -1].argmax())
            if nxt == cfg.get("eos_token_id"):
                break
            out.append(nxt)
        print(" ".join(map(str, out)))
    else:
        raise SystemExit(f"hf_reference.py: unknown mode {mode}")


if __name__ == "__main__":
    main()
