"""The CPU attention's row loop in C++ (kernels/attention_cpu.py, kernels/rotary_kv_attention_cpu.py).

At decode sizes (a verify block of K+1 queries, a draft's one query, rows of 100-1000 positions) each
torch call costs more than its arithmetic: the Python loop over rows, the per-row slices and masks, and
torch's fused CPU attention took 57 us for a draft's call over four rows and 148 us for a verify's
(docs/BENCHMARKS.md, CPU results), a quarter of the demo pair's batch-4 step. This does the same work
in one call: each row's step keys and values written into its cache slot, then, per row, head and
query, the scores over exactly the positions the query sees, [0, start_pos[b] + t], a softmax and the
weighted sum of values, in fp32 with at::vec's vectors (16 and 81 us for those two calls). Positions past
a row's last query are never read, so stale or NaN-poisoned entries cannot reach an output, as in the
torch path. Results match the reference to fp32 rounding (a different summation order).

build() compiles the source with Inductor's C++ code cache (the compiler and flags Inductor's own CPU
kernels get, cached on disk: about a second the first time on a machine). A CPU step compiled with
Inductor (Runtime(compile_cpu=True)) calls it, since it imports Inductor anyway; nothing else does,
because importing Inductor imports torch._dynamo, seconds that an eager CPU runtime does not otherwise
pay. Until build() has succeeded in the process, or where the inputs are not the plain case (fp32, the
last dim contiguous, queries <= MAX_QUERIES, every row's positions inside the cache), attend() returns
None and callers take the torch path. Imports torch only (Inductor's code cache in build()).
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["MAX_QUERIES", "SOURCE", "attend", "build"]

# Longer blocks (prefill chunks) take torch's attention, whose blocked GEMMs win there.
MAX_QUERIES = 16

SOURCE = r"""
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {
using Vec = at::vec::Vectorized<float>;

inline float dot(const float* a, const float* b, int64_t n) {
    Vec acc(0.0f);
    int64_t i = 0;
    for (; i + Vec::size() <= n; i += Vec::size()) acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
    float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
    for (; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

inline void axpy(float* out, float w, const float* v, int64_t n) {
    const Vec wv(w);
    int64_t i = 0;
    for (; i + Vec::size() <= n; i += Vec::size())
        at::vec::fmadd(wv, Vec::loadu(v + i), Vec::loadu(out + i)).store(out + i);
    for (; i < n; ++i) out[i] += w * v[i];
}

// p[j] = exp(p[j] - top) for j < n; returns their sum.
inline float softmax_numerators(float* p, int64_t n, float top) {
    const Vec top_v(top);
    Vec sums(0.0f);
    int64_t j = 0;
    for (; j + Vec::size() <= n; j += Vec::size()) {
        const Vec e = (Vec::loadu(p + j) - top_v).exp();
        e.store(p + j);
        sums = sums + e;
    }
    float total = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sums);
    for (; j < n; ++j) {
        p[j] = std::exp(p[j] - top);
        total += p[j];
    }
    return total;
}
}  // namespace

// keys/values: one layer's [slots, kv_heads, max_len, dim] (strides kv_ss, kv_sh, dim, 1); q [B, Hq, T, dim]
// and, when `write`, k/v [B, Hkv, T, dim] (strides given, dim contiguous); out [B, T, Hq, dim] contiguous.
// The caller checked every slot and position is inside the cache.
extern "C" void kernel(
    const float* q, const float* k, const float* v, float* keys, float* values, float* out,
    const int64_t* slots, const int64_t* starts, int64_t write, int64_t batch, int64_t q_heads,
    int64_t kv_heads, int64_t t_len, int64_t dim, int64_t max_len, int64_t q_sb, int64_t q_sh, int64_t q_st,
    int64_t k_sb, int64_t k_sh, int64_t k_st, int64_t v_sb, int64_t v_sh, int64_t v_st, int64_t kv_ss,
    int64_t kv_sh, int64_t scale_bits) {
    double scale;  // a double's bits: the binding passes integers and pointers only
    std::memcpy(&scale, &scale_bits, sizeof scale);
    if (write) {  // every row's keys and values first, in row order, as the torch path writes them
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t h = 0; h < kv_heads; ++h)
                for (int64_t t = 0; t < t_len; ++t) {
                    const int64_t at = slots[b] * kv_ss + h * kv_sh + (starts[b] + t) * dim;
                    std::memcpy(keys + at, k + b * k_sb + h * k_sh + t * k_st, dim * sizeof(float));
                    std::memcpy(values + at, v + b * v_sb + h * v_sh + t * v_st, dim * sizeof(float));
                }
    }
    const int64_t group = q_heads / kv_heads;
    std::vector<float> p(max_len);
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < q_heads; ++h) {
            const float* k_head = keys + slots[b] * kv_ss + (h / group) * kv_sh;
            const float* v_head = values + slots[b] * kv_ss + (h / group) * kv_sh;
            for (int64_t t = 0; t < t_len; ++t) {
                const float* qv = q + b * q_sb + h * q_sh + t * q_st;
                const int64_t length = std::min(starts[b] + t + 1, max_len);  // query t sees [0, start + t]
                float top = -INFINITY;
                for (int64_t j = 0; j < length; ++j) {
                    p[j] = dot(qv, k_head + j * dim, dim) * static_cast<float>(scale);
                    top = std::max(top, p[j]);
                }
                const float total = softmax_numerators(p.data(), length, top);
                float* o = out + ((b * t_len + t) * q_heads + h) * dim;
                std::fill(o, o + dim, 0.0f);
                for (int64_t j = 0; j < length; ++j) axpy(o, p[j], v_head + j * dim, dim);
                const float inv = 1.0f / total;
                for (int64_t d = 0; d < dim; ++d) o[d] *= inv;
            }
        }
    }
}
"""

_ARGUMENTS = ["const float*"] * 3 + ["float*"] * 3 + ["const int64_t*"] * 2 + ["int64_t"] * 19
_compiled: list[Callable[..., None] | None] = []  # [] before build(), then [kernel, or None if it failed]


def build() -> bool:
    """Compile the C++ loop (once per process); whether it is available. A failure (no compiler, an
    Inductor without this cache) is warned about once, and the torch path serves."""
    if not _compiled:
        try:
            from torch._inductor.codecache import CppPythonBindingsCodeCache

            _compiled.append(CppPythonBindingsCodeCache.load_pybinding(_ARGUMENTS, SOURCE))
        except Exception as error:
            warnings.warn(
                f"graphspec: the C++ CPU attention did not build ({error!r:.300}); using torch's", stacklevel=2
            )
            _compiled.append(None)
    return _compiled[0] is not None


def attend(
    q: Tensor,
    cache: Tensor,
    layer: int,
    slots: list[int],
    starts: list[int],
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    k: Tensor | None = None,
    v: Tensor | None = None,
) -> Tensor | None:
    """kv_attention / attention of the torch path in one C++ call ([B, T, Hq, D] contiguous), or None
    where this does not apply (module docstring). `slots`/`starts` are slot_ids/start_pos on the host."""
    batch, q_heads, t, dim = q.shape
    if cache.dim() != 6 or cache.shape[-1] != dim:  # [layers, 2, slots, Hkv, max_len, D]
        return None
    _, _, n_slots, kv_heads, max_len, _ = cache.shape
    tensors = (q, cache) if k is None else (q, cache, k, v)
    plain = (
        t <= MAX_QUERIES
        and all(x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(-1) == 1 for x in tensors)
        and cache.is_contiguous()
        and (k is None or k.shape == v.shape == (batch, kv_heads, t, dim))
        and all(x.dtype == torch.int64 and x.device.type == "cpu" and x.is_contiguous() for x in (slot_ids, start_pos))
        and q_heads % kv_heads == 0
        and len(slots) == len(starts) == batch
        and all(0 <= s < n_slots and 0 <= p and p + t <= max_len for s, p in zip(slots, starts, strict=True))
    )
    kernel = _compiled[0] if plain and _compiled else None
    if kernel is None:
        return None
    keys, values = cache[layer]
    out = torch.empty((batch, t, q_heads, dim), dtype=torch.float32)
    write = k is not None
    k, v = (k, v) if write else (q, q)  # unread without `write`
    kernel(
        q, k, v, keys, values, out, slot_ids, start_pos, int(write), batch, q_heads, kv_heads, t, dim, max_len,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], keys.stride(0), keys.stride(1),
        struct.unpack("<q", struct.pack("<d", scale))[0],
    )  # fmt: skip
    return out
