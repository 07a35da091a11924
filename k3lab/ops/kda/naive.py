"""Kimi Delta Attention (KDA) in plain PyTorch: the reference the layer runs on CPU and the fused kernels are held to.

Per head, with state S (dk x dv), log-space per-channel decay g_t (dk) and scalar beta_t:

    S_t = diag(exp(g_t)) S_{t-1}
    S_t = S_t + beta_t k_t (v_t - S_t^T k_t)^T
    o_t = S_t^T (q_t * scale)

`recurrent_kda` runs this token by token (the oracle, FLA's `naive_recurrent_kda`);
`chunk_kda_reference` computes the same thing a chunk of C tokens at a time (the WY/UT form),
which turns most of the work into matrix products. The fused path is FLA's `chunk_kda` (`fused.py`).
"""

from __future__ import annotations

import torch


def recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """Token-by-token KDA. q, k, g: (B, T, H, dk); v: (B, T, H, dv); beta: (B, T, H).

    Returns o (B, T, H, dv) in v's dtype and the final state (B, H, dk, dv) in fp32 or None.
    """
    B, T, H, dk = q.shape
    scale = dk**-0.5 if scale is None else scale
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    S = q.new_zeros(B, H, dk, v.shape[-1])
    if initial_state is not None:
        S = S + initial_state.float()
    outputs = []
    for t in range(T):
        S = S * g[:, t].exp().unsqueeze(-1)
        k_t = k[:, t]  # (B, H, dk)
        residual = v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S)
        S = S + torch.einsum("bhk,bhv->bhkv", beta[:, t, :, None] * k_t, residual)
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(outputs, dim=1).to(v.dtype), (S if output_final_state else None)


def chunk_kda_reference(q, k, v, g, beta, chunk_size=64, scale=None, initial_state=None, output_final_state=False):
    """Chunkwise KDA in plain PyTorch, exactly the semantics of `recurrent_kda`.

    Layout as FLA: q, k, g (B, T, H, dk), v (B, T, H, dv), beta (B, T, H); g in log space.
    T must be a multiple of chunk_size. State and arithmetic are fp32.

    Inside a chunk with cumulative decay G_r = sum_{s<=r} g_s, the delta rule's
    corrections form a unit lower-triangular system (I + A) X = diag(beta) [exp(G) k | v]
    with A[r, c] = beta_r <k_r, exp(G_r - G_c) k_c> for c < r. Its solution gives
    W (the state read-out keys) and U (the pseudo-values); the state is then passed
    between chunks once per chunk instead of once per token.
    """
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    if T % chunk_size != 0:
        raise ValueError(f"chunk_kda_reference: sequence length {T} is not a multiple of chunk_size={chunk_size}")
    scale = dk**-0.5 if scale is None else scale
    N, C = T // chunk_size, chunk_size

    def chunked(t):  # (B, T, H, ...) -> (B, H, N, C, ...) in fp32
        return t.float().transpose(1, 2).reshape(B, H, N, C, *t.shape[3:])

    q, k, v, g, beta = chunked(q) * scale, chunked(k), chunked(v), chunked(g), chunked(beta)
    G = g.cumsum(dim=3)  # (B, H, N, C, dk), non-increasing along C

    Akk, Aqk = decayed_scores(torch.stack([k, q], dim=-3), k, G).unbind(-3)  # (B, H, N, C, C) each
    A = Akk.tril(-1) * beta.unsqueeze(-1) + torch.eye(C, device=q.device)
    rhs = beta.unsqueeze(-1) * torch.cat([G.exp() * k, v], dim=-1)
    WU = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    W, U = WU.split([dk, dv], dim=-1)  # (B, H, N, C, dk), (B, H, N, C, dv)

    # between chunks: S_n = (diag(exp(G_last)) - K_tail^T W) S_{n-1} + K_tail^T U, with
    # K_tail = k decayed to the chunk's end; only this (dk x dk) @ (dk x dv) step is sequential
    G_last = G[..., -1:, :]  # (B, H, N, 1, dk)
    K_tail = ((G_last - G).exp() * k).transpose(-1, -2)  # (B, H, N, dk, C)
    transition = torch.diag_embed(G_last.squeeze(-2).exp()) - K_tail @ W  # (B, H, N, dk, dk)
    injection = K_tail @ U  # (B, H, N, dk, dv)
    S = q.new_zeros(B, H, dk, dv)
    if initial_state is not None:
        S = S + initial_state.float()
    states_before = []
    for n in range(N):
        states_before.append(S)
        S = transition[:, :, n] @ S + injection[:, :, n]
    S_prev = torch.stack(states_before, dim=2)  # (B, H, N, dk, dv): the state entering each chunk
    V = U - W @ S_prev  # new values after reading the decayed state
    o = (q * G.exp()) @ S_prev + Aqk @ V  # (B, H, N, C, dv)
    o = o.reshape(B, H, T, dv).transpose(1, 2)
    return o.to(v.dtype), (S if output_final_state else None)


def decayed_scores(a, b, G, sub_chunk=8):
    """M[..., r, c] = sum_d a_r[d] b_c[d] exp(G_r[d] - G_c[d]) for c <= r, else 0.

    a: (..., X, C, d) -- X query-like tensors sharing one decay, e.g. (k, q) stacked;
    b, G: (..., C, d). Returns (..., X, C, C). Never forms exp(+G), which overflows under
    strong decay: inside a sub-chunk of s rows the pairwise decay is used directly, and a
    sub-chunk starting at i0 meets all earlier columns through e = G[i0 - 1], where
    exp(G_r - e) and exp(e - G_c) are both at most 1, so that part is a matrix product.
    """
    *_, C, d = G.shape
    s = sub_chunk if C % sub_chunk == 0 else C
    blocks = lambda t: t.unflatten(-2, (C // s, s))  # noqa: E731  (..., C, d) -> (..., n, s, d)
    G_blocks = blocks(G)
    pair_decay = (G_blocks.unsqueeze(-2) - G_blocks.unsqueeze(-3)).clamp(max=0).exp()  # (..., n, s, s, d)
    decayed_b = pair_decay * blocks(b).unsqueeze(-3)  # [r, c, d] = exp(G_r - G_c) b_c
    inside = torch.einsum("...xnrd,...nrcd->...xnrc", blocks(a), decayed_b).tril()  # (..., X, n, s, s)
    # e_i = G just before sub-chunk i (G[0] for the first, which has no earlier columns)
    e = torch.cat([G[..., :1, :], G[..., s - 1 : C - 1 : s, :]], dim=-2).unsqueeze(-2)  # (..., n, 1, d)
    left = blocks(a) * (G_blocks - e).exp().unsqueeze(-4)  # (..., X, n, s, d)
    out = a.new_zeros(*a.shape[:-1], C)
    for i, i0 in enumerate(range(0, C, s)):
        out[..., i0 : i0 + s, i0 : i0 + s] = inside[..., i, :, :]
        if i0 > 0:  # columns before this sub-chunk, factorised through e_i
            right = b[..., :i0, :] * (e[..., i, :, :] - G[..., :i0, :]).exp()  # (..., i0, d)
            out[..., i0 : i0 + s, :i0] = left[..., i, :, :] @ right.unsqueeze(-3).transpose(-1, -2)
    return out
