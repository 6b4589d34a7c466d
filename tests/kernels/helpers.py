"""Shared helpers for kernel tests: device choice, error metrics, output poisoning."""

from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Relative-error bars (‖out - exact‖ / ‖exact‖, exact = fp32 math on the same inputs): fp32 kernels
# land far under 1e-3; 16-bit ones between 1e-3 and 1e-2 (output rounding alone is ~2e-3).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 5e-3}


def rel_error(out: torch.Tensor, exact: torch.Tensor) -> float:
    out, exact = out.double(), exact.double()
    return ((out - exact).norm() / exact.norm().clamp_min(1e-30)).item()


def poison_allocator(device: torch.device = DEVICE, megabytes: int = 64) -> None:
    """Fill freed CUDA memory with NaN so an output element a kernel forgot to write shows up as NaN
    (torch.empty reuses the caching allocator's blocks). A no-op on CPU."""
    if device.type == "cuda":
        large = torch.full((megabytes << 18,), float("nan"), device=device)  # the large-block pool
        small = [torch.full((1 << 17,), float("nan"), device=device) for _ in range(8)]  # the small pool
        torch.cuda.synchronize(device)
        del large, small


def bits(x: torch.Tensor) -> torch.Tensor:
    """The raw bits, so NaN payloads and -0.0 compare too."""
    return x.view({2: torch.int16, 4: torch.int32}[x.element_size()])


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_rounding_equal(out: torch.Tensor, reference: torch.Tensor) -> None:
    """16-bit outputs computed with the reference's exact rounding steps. On the CPU both sides run
    the same fp32 arithmetic, so they are equal; on CUDA torch's rsqrt and reduction order differ from
    the kernel's by an fp32 ulp or two, which moves a few normalized values across a bf16 rounding
    boundary (one ulp), and the weight product can round that to two: at most two ulps apart, in under
    1% of the elements."""
    if out.device.type != "cuda":
        torch.testing.assert_close(out, reference, rtol=0, atol=0)
        return
    ulp = torch.finfo(out.dtype).eps * reference.float().abs().clamp_min(torch.finfo(out.dtype).tiny)
    diff = (out.float() - reference.float()).abs()
    assert (diff <= 2.01 * ulp).all(), (diff / ulp).max()
    assert (diff > 0).float().mean().item() < 1e-2


def projection_inputs(
    batch: int, q_heads: int, kv_heads: int, t: int, head_dim: int, dtype: torch.dtype, g: torch.Generator
) -> list[torch.Tensor]:
    """q, k, v as the decoder passes them to the rotary ops, [B, T, H, D] slices of one fused qkv
    projection transposed to [B, H, T, D] (no two of their strides contiguous), and cos/sin [B, T, D]
    of random angles (fp32, on DEVICE)."""
    widths = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    qkv = torch.randn(batch, t, sum(widths), generator=g).to(DEVICE, dtype)
    q, k, v = (
        part.view(batch, t, heads, head_dim).transpose(1, 2)
        for part, heads in zip(qkv.split(widths, dim=-1), (q_heads, kv_heads, kv_heads), strict=True)
    )
    angles = torch.rand(batch, t, head_dim // 2, generator=g) * 100
    angles = torch.cat((angles, angles), dim=-1)
    return [q, k, v, angles.cos().to(DEVICE), angles.sin().to(DEVICE)]


def assert_unread_past_the_window(kernel, reference, inputs, cache, slot_ids, start_pos, t: int) -> None:
    """A CPU attention kernel that writes this call's t positions and reads each row's window only: NaN
    past start_pos + t (stale or poisoned positions) reaches no output and stays where it is. Both ops
    take (*inputs, cache, layer 0, slot_ids, start_pos, scale)."""
    clean = cache.clone()
    expected = reference(*inputs, clean, 0, slot_ids, start_pos, 0.125)
    for slot, start in zip(slot_ids.tolist(), start_pos.tolist(), strict=True):
        cache[:, :, slot, :, start + t :] = float("nan")
    out = kernel(*inputs, cache, 0, slot_ids, start_pos, 0.125)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for slot, start in zip(slot_ids.tolist(), start_pos.tolist(), strict=True):
        assert torch.equal(cache[0, :, slot, :, : start + t], clean[0, :, slot, :, : start + t])
