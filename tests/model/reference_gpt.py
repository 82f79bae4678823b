#!/usr/bin/python3
"""Reference GPT in PyTorch for megatron-cpp's model test (written for this test).

usage: /usr/bin/python3 reference_gpt.py IN.safetensors OUT.safetensors

IN (safetensors; see src/core/safetensors.h) holds every parameter under its
Megatron name, "tokens" and "labels" ([B, T] int32; label < 0 ignored), and in
__metadata__ "config": a JSON object with the model's flags. The model is run
in float32 on [s, b, h] activations; OUT receives "logits" ([s*b, V]),
"loss" ([1]) and "grad.<name>" for every parameter.
Exit code 77 when torch is not installed (the C++ test then skips).
"""
import json
import math
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"reference_gpt.py: {e}; install python3-torch python3-numpy", file=sys.stderr)
    sys.exit(77)

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().contiguous().numpy()
        code = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}[a.dtype]
        b = a.tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def norm(x, w, b, cfg):
    if cfg.get("apply_layernorm_1p", False):  # zero-centred gamma: multiply by 1 + w
        w = w + 1
    if cfg["normalization"] == "RMSNorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["norm_epsilon"]) * w
    return F.layer_norm(x, (x.shape[-1],), w, b, cfg["norm_epsilon"])


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def forward(P, tokens, labels, cfg):
    B, T = tokens.shape
    h, a, g, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_query_groups"], cfg["kv_channels"]
    qpg = a // g
    tok = tokens.t().long()  # [s, b]
    x = P["embedding.word_embeddings.weight"][tok]
    if cfg["position_embedding_type"] == "learned_absolute":
        x = x + P["embedding.position_embeddings.weight"][:T].unsqueeze(1)
    if cfg["position_embedding_type"] == "rope":
        # Megatron's RotaryEmbedding: the leading rot = int(d * rotary_percent)
        # dims rotate; Llama 3.1 frequency scaling; positions / interpolation.
        pct = cfg.get("rotary_percent", 1.0)
        dim = int(d * pct) if pct < 1.0 else d
        inv = 1.0 / (cfg["rotary_base"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        rot = 2 * inv.numel()  # an odd dim rotates dim + 1 dims
        if cfg.get("use_rope_scaling", False):
            factor, old_len, low, high = cfg["rope_scaling_factor"], 8192.0, 1.0, 4.0
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
            smooth = (old_len / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
            inv = torch.where(medium, smoothed, scaled)
        pos = torch.arange(T, dtype=torch.float64) * (1.0 / cfg.get("rotary_interpolation", 1.0))
        ang = torch.outer(pos, inv)
        interleaved = cfg.get("rotary_interleaved", False)
        if interleaved:  # each frequency twice in a row; pairs (2i, 2i + 1)
            ang = torch.stack((ang, ang), dim=-1).reshape(T, -1)
        else:
            ang = torch.cat((ang, ang), dim=-1)  # [s, rot]
        cos = ang.cos().float()[:, None, None, :]
        sin = ang.sin().float()[:, None, None, :]

        def rotate(x):
            if not interleaved:
                return rotate_half(x)
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).reshape(x.shape)

        def rope(t):
            r, rest = t[..., :rot], t[..., rot:]
            return torch.cat((r * cos + rotate(r) * sin, rest), dim=-1)
    if cfg.get("multi_latent_attention", False):
        mla_rope = mla_rotary(cfg, T)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    post = cfg["apply_residual_connection_post_layernorm"]

    def bias(name):
        return P.get(name)

    def linear(x, name):
        y = x @ P[name + ".weight"].t()
        b = bias(name + ".bias")
        return y if b is None else y + b

    aux_total = torch.zeros(())
    z_total = torch.zeros(())

    def layer(x, p, is_moe):
        """One transformer layer under prefix p: (output, load-balancing loss, z-loss)."""
        ln1 = norm(x, P[p + "input_layernorm.weight"], bias(p + "input_layernorm.bias"), cfg)
        if cfg.get("multi_latent_attention", False):
            ctx = mla(ln1, P, p + "self_attention.", cfg, linear, bias, mla_rope, mask)
        else:
            qkv = linear(ln1, p + "self_attention.linear_qkv").view(T, B, g, (qpg + 2) * d)
            q = qkv[..., : qpg * d].reshape(T, B, a, d)
            k = qkv[..., qpg * d: (qpg + 1) * d]  # [s, b, g, d]
            v = qkv[..., (qpg + 1) * d:]
            if cfg.get("qk_layernorm", False):  # one norm over each head's d values, before RoPE
                q = norm(q, P[p + "self_attention.q_layernorm.weight"], bias(p + "self_attention.q_layernorm.bias"), cfg)
                k = norm(k, P[p + "self_attention.k_layernorm.weight"], bias(p + "self_attention.k_layernorm.bias"), cfg)
            if cfg["position_embedding_type"] == "rope":
                q = rope(q)
                k = rope(k)
            k = k.repeat_interleave(qpg, dim=2)  # head j uses group j // qpg
            v = v.repeat_interleave(qpg, dim=2)
            qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, a, s, d]
            s = (qh @ kh.transpose(-1, -2)) / math.sqrt(d)
            s = s.masked_fill(mask, float("-inf"))
            ctx = (torch.softmax(s, dim=-1) @ vh).permute(2, 0, 1, 3).reshape(T, B, a * d)
        x_mid = (ln1 if post else x) + linear(ctx, p + "self_attention.linear_proj")
        ln2 = norm(x_mid, P[p + "pre_mlp_layernorm.weight"], bias(p + "pre_mlp_layernorm.bias"), cfg)
        if is_moe:
            mlp_out, aux, z = moe(ln2.reshape(T * B, h), p + "mlp.", cfg, linear, B)
            return x_mid + mlp_out.reshape(T, B, h), aux, z
        fc1 = linear(ln2, p + "mlp.linear_fc1")
        return (ln2 if post else x_mid) + linear(activation(fc1, cfg), p + "mlp.linear_fc2"), 0.0, 0.0

    pattern = moe_pattern(cfg) if cfg.get("num_experts", 0) else [0] * cfg["num_layers"]
    for i in range(cfg["num_layers"]):
        x, aux, z = layer(x, f"decoder.layers.{i}.", pattern[i])
        aux_total = aux_total + aux
        z_total = z_total + z
    x = norm(x, P["decoder.final_layernorm.weight"], bias("decoder.final_layernorm.bias"), cfg)
    out_w = P["output_layer.weight"] if "output_layer.weight" in P else P["embedding.word_embeddings.weight"]
    logits = (x @ out_w.t()).reshape(T * B, -1)
    loss = F.cross_entropy(logits, labels.t().reshape(-1).long(), ignore_index=-1)
    # Multi-token prediction (Megatron's MultiTokenPredictionBlock): depth k
    # embeds the tokens rolled left k times (zeros rolled in, their labels
    # masked), joins enorm(embedding) and hnorm(previous hidden) through
    # eh_proj, runs a layer like the last decoder layer, its own final norm,
    # and the shared output layer on the labels rolled as far.
    mtp_losses = []
    hk, tok_k, lab_k = x, tok, labels.t().long()
    repeated = cfg.get("mtp_use_repeated_layer", False)  # one MTP layer at every depth
    for k in range(cfg.get("mtp_num_layers", 0)):
        m = f"mtp.layers.{0 if repeated else k}."
        tok_k = torch.cat((tok_k[1:], torch.zeros_like(tok_k[:1])), 0)
        lab_k = torch.cat((lab_k[1:], torch.full_like(lab_k[:1], -1)), 0)
        e = P["embedding.word_embeddings.weight"][tok_k]
        cat = torch.cat((norm(e, P[m + "enorm.weight"], bias(m + "enorm.bias"), cfg),
                         norm(hk, P[m + "hnorm.weight"], bias(m + "hnorm.bias"), cfg)), -1)
        xk, aux, z = layer(cat @ P[m + "eh_proj.weight"].t(), m + "transformer_layer.", pattern[-1])
        w = 1.0 / cfg["mtp_num_layers"] if repeated else 1.0  # Megatron's router losses of a repeated layer, 1/D each
        aux_total = aux_total + w * aux
        z_total = z_total + w * z
        hk = norm(xk, P[m + "final_layernorm.weight"], bias(m + "final_layernorm.bias"), cfg)
        mtp_logits = (hk @ out_w.t()).reshape(T * B, -1)
        mtp_losses.append(F.cross_entropy(mtp_logits, lab_k.reshape(-1), ignore_index=-1))
        # Megatron's acceptance count: counted labels the depth's argmax guesses.
        lab_flat = lab_k.reshape(-1)
        MTP_CORRECT.append(float(((mtp_logits.argmax(-1) == lab_flat) & (lab_flat >= 0)).sum()))
    return logits, loss, aux_total, z_total, mtp_losses


def yarn_mscale(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def mla_rotary(cfg, T):
    """MLA's rotary table as Megatron's MultiLatentAttention builds it: (cos,
    sin) [s, 1, 1, r] with cat(freqs, freqs), already times mscale.
    RotaryEmbedding for --rope-type rope (rotary_percent of the position dims),
    else YarnRotaryEmbedding (original context 4096, beta_fast 32, beta_slow 1)."""
    dim = cfg["qk_pos_emb_head_dim"]
    base = cfg["rotary_base"]
    pos = torch.arange(T, dtype=torch.float64)
    if cfg.get("rope_type", "") == "rope":
        pct = cfg.get("rotary_percent", 1.0)
        if pct < 1.0:
            dim = int(dim * pct)
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        mscale = 1.0
    else:
        factor = cfg.get("rotary_scaling_factor", 1.0)
        extra = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        inter = extra / factor

        def corr(rot):
            return dim * math.log(4096 / (rot * 2 * math.pi)) / (2 * math.log(base))
        low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1.0 - ramp
        inv = inter * (1 - keep) + extra * keep
        mscale = yarn_mscale(factor, cfg.get("mscale", 1.0)) / yarn_mscale(factor, cfg.get("mscale_all_dim", 0.0))
    ang = torch.outer(pos, inv)
    emb = torch.cat((ang, ang), dim=-1)[:, None, None, :]
    return (emb.cos() * mscale).float(), (emb.sin() * mscale).float()


def mla_rope(t, table):
    """Megatron's _apply_rotary_pos_emb_bshd with mla_rotary_interleaved: the
    rotated dims split into even and odd halves, then rotate-half."""
    cos, sin = table
    r = cos.shape[-1]
    x, rest = t[..., :r], t[..., r:]
    x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return torch.cat((x * cos + rotate_half(x) * sin, rest), dim=-1)


def mla(x, P, p, cfg, linear, bias, table, mask):
    """Megatron's MLASelfAttention on x [s, b, h]: the attention output [s, b, a dv]."""
    T, B, _ = x.shape
    a, dn, dr, dv = cfg["num_attention_heads"], cfg["qk_head_dim"], cfg["qk_pos_emb_head_dim"], cfg["v_head_dim"]
    kl = cfg["kv_lora_rank"]
    qk_norm = cfg.get("qk_layernorm", False)
    if cfg.get("q_lora_rank"):
        cq = linear(x, p + "linear_q_down_proj")
        if qk_norm:
            cq = norm(cq, P[p + "q_layernorm.weight"], bias(p + "q_layernorm.bias"), cfg)
        q = linear(cq, p + "linear_q_up_proj")
    else:
        q = linear(x, p + "linear_q_proj")
    q = q.view(T, B, a, dn + dr)
    kv_combined = linear(x, p + "linear_kv_down_proj")
    c, k_pe = kv_combined[..., :kl], kv_combined[..., kl:]
    if qk_norm:
        c = norm(c, P[p + "kv_layernorm.weight"], bias(p + "kv_layernorm.bias"), cfg)
    kv = linear(c, p + "linear_kv_up_proj").view(T, B, a, dn + dv)
    q_nope, q_pe = q[..., :dn], q[..., dn:]
    k_nope, v = kv[..., :dn], kv[..., dn:]
    q_pe = mla_rope(q_pe, table)
    k_pe = mla_rope(k_pe.unsqueeze(-2), table).expand(T, B, a, dr)
    query = torch.cat((q_nope, q_pe), dim=-1)
    key = torch.cat((k_nope, k_pe), dim=-1)
    m = yarn_mscale(cfg.get("rotary_scaling_factor", 1.0), cfg.get("mscale_all_dim", 0.0))
    scale = m * m / math.sqrt(dn + dr)
    qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (query, key, v))  # [b, a, s, .]
    s = (qh @ kh.transpose(-1, -2)) * scale
    s = s.masked_fill(mask, float("-inf"))
    return (torch.softmax(s, dim=-1) @ vh).permute(2, 0, 1, 3).reshape(T, B, a * dv)


def moe_pattern(cfg):
    """Megatron's --moe-layer-freq: an integer N (layer i is MoE iff i % N == 0)
    or a Python list expression with one 0/1 per layer."""
    f = cfg.get("moe_layer_freq", "1")
    L = cfg["num_layers"]
    if "[" in f:
        pattern = eval(f)
        assert len(pattern) == L, (pattern, L)
        return pattern
    return [1 if i % int(f) == 0 else 0 for i in range(L)]


def activation(fc1, cfg):
    if cfg["swiglu"]:
        gate, up = fc1.chunk(2, dim=-1)
        return F.silu(gate) * up
    if cfg.get("squared_relu", False):  # Megatron's squared_relu: relu(x) ** 2
        return torch.pow(F.relu(fc1), 2)
    return F.gelu(fc1, approximate="tanh" if cfg["gelu_tanh"] else "none")


def moe(xs, p, cfg, linear, B):
    """Megatron's MoELayer written plainly: top-k routing (softmax over the
    chosen logits, or with pre-softmax the full softmax's values), experts
    run token by token, outputs weighted and summed; the switch
    load-balancing loss and the z-loss as in moe_utils (unweighted)."""
    E, k = cfg["num_experts"], cfg["moe_router_topk"]
    N = xs.shape[0]
    J = JITTER.get(p)  # --moe-input-jitter-eps: the router's input times the model's noise
    logits = (xs if J is None else xs * J) @ P_ROUTER(p).t()
    G, gk = cfg.get("moe_router_num_groups", 0), cfg.get("moe_router_group_topk", 0)

    def topk_idx(sel):  # Megatron's group_limited_topk when group-topk is set
        if not gk:
            return torch.topk(sel, k, dim=-1)[1]
        gs = sel.view(N, G, -1).topk(k // gk, dim=-1)[0].sum(dim=-1)
        gmask = torch.zeros_like(gs).scatter(1, torch.topk(gs, gk, dim=-1)[1], 1)
        smask = gmask.unsqueeze(-1).expand(N, G, E // G).reshape(N, -1)
        return torch.topk(sel.masked_fill(~smask.bool(), float("-inf")), k, dim=-1)[1]

    aux_idx = None
    if cfg.get("moe_router_score_function", "softmax") == "sigmoid":
        # DeepSeek-V3's router: the top k by sigmoid + expert bias, the chosen
        # sigmoids normalised over the k; the load-balancing loss takes the
        # sigmoids normalised to sum 1, and counts tokens by their own top k.
        sig = torch.sigmoid(logits)
        b = BIAS.get(p + "router.expert_bias")
        idx = topk_idx(sig + b if b is not None else sig)
        chosen = sig.gather(1, idx)
        probs = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else chosen
        scores = sig / (sig.sum(dim=-1, keepdim=True) + 1e-20)
        aux_idx = torch.topk(scores, k, dim=-1)[1]
    elif cfg["moe_router_pre_softmax"]:
        scores = torch.softmax(logits, dim=-1)
        idx = topk_idx(scores)
        probs = scores.gather(1, idx)
    else:
        scores = torch.softmax(logits, dim=-1)
        idx = topk_idx(logits)
        probs = torch.softmax(logits.gather(1, idx), dim=-1)
    if gk:  # the load-balancing loss counts by the plain top k
        aux_idx = torch.topk(scores, k, dim=-1)[1]
    probs = probs * cfg["moe_router_topk_scaling_factor"]
    cf = cfg.get("moe_expert_capacity_factor")
    if cf is not None and cf >= 0:
        probs = probs * capacity_mask(idx, probs, E, k, cf, cfg)
    out = torch.zeros_like(xs)
    for e in range(E):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        y = linear(activation(linear(xs[rows], p + f"experts.local_experts.{e}.linear_fc1"), cfg),
                   p + f"experts.local_experts.{e}.linear_fc2")
        out = out.index_add(0, rows, probs[rows, slot].unsqueeze(1) * y)
    if cfg.get("moe_shared_expert_intermediate_size", 0):  # the shared expert: an MLP on every token
        shared = linear(activation(linear(xs, p + "shared_experts.linear_fc1"), cfg), p + "shared_experts.linear_fc2")
        if cfg.get("moe_shared_expert_gate", False):  # Megatron's SharedExpertMLP gate: sigmoid(x g^T) per token
            shared = shared * torch.sigmoid(xs @ P_ROUTER(p + "shared_experts.gate_weight", "").t())
        out = out + shared
    choice = torch.nn.functional.one_hot(idx if aux_idx is None else aux_idx, E).sum(dim=1).to(scores.dtype)
    if cfg.get("moe_router_load_balancing_type", "aux_loss") == "seq_aux_loss":
        # Megatron's sequence-level loss: the switch loss of each sequence
        # (rows b, b + B, ... in [s, b] order), averaged over the B sequences.
        T = N // B
        aux = sum((scores[b::B].sum(dim=0) * choice[b::B].sum(dim=0)).sum() for b in range(B)) * E / (k * T * T) / B
    else:
        aux = (scores.sum(dim=0) * choice.sum(dim=0)).sum() * E / (k * N * N)
    z = torch.logsumexp(logits, dim=-1).square().mean()
    return out, aux, z


def capacity_mask(idx, probs, E, k, cf, cfg):
    """Megatron's apply_router_token_dropping on each segment of consecutive
    tokens (the tokens one rank routes): the [tokens, E] routing map and
    probabilities, each expert's column keeping its top `capacity` entries
    (probs: torch.topk down the column; position: the first tokens that
    chose it), as a [N, k] mask of the kept choices."""
    N = idx.shape[0]
    segs = cfg.get("moe_capacity_segments", 1)
    Ns = N // segs
    capacity = math.ceil((Ns * k / E) * cf)
    keep = torch.zeros(N, k, dtype=torch.bool)
    for s in range(segs):
        ix, p = idx[s * Ns:(s + 1) * Ns], probs[s * Ns:(s + 1) * Ns].detach()
        routing_map = torch.zeros(Ns, E, dtype=torch.bool).scatter(1, ix, True)
        routing_probs = torch.zeros(Ns, E, dtype=p.dtype).scatter(1, ix, p)
        if capacity > Ns:
            cap = torch.ones(Ns, E, dtype=torch.bool)
        elif cfg.get("moe_token_drop_policy", "probs") == "probs":
            top = torch.topk(routing_probs, k=capacity, dim=0, sorted=False)[1]
            cap = torch.zeros(Ns, E).scatter(0, top, 1).bool()
        else:
            cap = routing_map.long().cumsum(dim=0) <= capacity
        keep[s * Ns:(s + 1) * Ns] = (routing_map & cap).gather(1, ix)
    return keep.to(probs.dtype)


MTP_CORRECT = []  # per MTP depth: counted labels equal to the depth's argmax


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    cfg = json.loads(meta["config"])
    tokens, labels = tensors.pop("tokens"), tensors.pop("labels")
    global BIAS  # --moe-router-enable-expert-bias: state, not parameters
    BIAS = {n: tensors.pop(n).float() for n in list(tensors) if n.endswith("router.expert_bias")}
    global JITTER  # --moe-input-jitter-eps: each MoE layer's noise [T*B, h], drawn by the model
    JITTER = {n[:-len("router.jitter")]: tensors.pop(n).float() for n in list(tensors) if n.endswith("router.jitter")}
    P = {n: t.float().requires_grad_(True) for n, t in tensors.items()}
    torch.set_num_threads(1)
    global P_ROUTER
    P_ROUTER = lambda p, name="router.weight": P[p + name]  # an MoE layer's router (or shared gate) weight
    logits, loss, aux, z, mtp = forward(P, tokens, labels, cfg)
    total = loss + cfg.get("moe_aux_loss_coeff", 0.0) * aux + cfg.get("moe_z_loss_coeff", 0.0) * z
    if mtp:  # the MTP loss: --mtp-loss-scaling-factor times the depths' mean
        total = total + cfg["mtp_loss_scaling_factor"] / len(mtp) * sum(mtp)
    total.backward()
    out = {"logits": logits, "loss": loss.reshape(1), "moe_aux": aux.reshape(1), "moe_z": z.reshape(1)}
    if mtp:
        out["mtp_loss"] = torch.stack(mtp)
        out["mtp_correct"] = torch.tensor(MTP_CORRECT)
    for n, t in P.items():
        out["grad." + n] = t.grad if t.grad is not None else torch.zeros_like(t)
    write_safetensors(sys.argv[2], out)


if __name__ == "__main__":
    main()
