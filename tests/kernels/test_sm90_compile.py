"""Every Triton kernel launched in lab/kernels, compiled (never launched) for sm_90 (H100/H200)
on a machine without a GPU, with the dtypes a GPU run uses (bf16, fp16, fp8 e4m3, int8) and the
tile configs the wrappers pick (each `pick_config` / `_launch_config` branch).

Compiled mode meets errors the interpreter never does: the first H200 run failed on
`tl.dot(int8, int8, int32 acc)` (triton 3.6 asserts the accumulator's dtype equals out_dtype,
which defaults to fp32; the interpreter, and triton 3.9, accept it). Each variant must also fit
the 227 KiB of shared memory of an sm_90 block (exceeding it fails only at launch), and a few
PTX properties that the kernels' bit-exact contracts rely on are checked (tensor-core dots,
IEEE division in quantize, no FMA contraction in rotary).

`CASES` maps "module.kernel" to a function that builds that kernel's variants; it runs in the
compile worker of tests/kernels/sm90.py (TRITON_INTERPRET=0). `test_every_launched_kernel_has_a_case`
finds the launched kernels (`name[grid](...)` in lab/kernels/*.py) so a new kernel needs a case.
Skips when the triton wheel has no NVIDIA backend or ptxas. To compile with another Triton
(the GPU machine's version), point LAB_SM90_PYTHON at a Python that has it (see sm90.py).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kernels.sm90 import compile_for_sm90

KERNELS_DIR = Path(__file__).resolve().parents[2] / "lab" / "kernels"
SM90_SHARED = 232448  # bytes of shared memory one sm_90 block may use (227 KiB)
DT16 = ("bf16", "fp16")


def _compile(build, fn, types: dict, consts: dict, aligned=None, **opts):
    """Build fn for sm_90 (pointers and strides 16-aligned unless `aligned` says otherwise);
    check its shared memory; return the PTX."""
    if aligned is None:
        aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")}
    k = build(fn, types, consts, aligned, **opts)
    assert k.metadata.shared <= SM90_SHARED, (fn.__name__, consts, k.metadata.shared)
    return k.asm["ptx"]


def _tiles(cfg: dict) -> tuple[dict, dict]:
    """A wrapper's config split into constexprs (upper case) and compile options."""
    return ({k: v for k, v in cfg.items() if k.isupper()},
            {k: v for k, v in cfg.items() if not k.isupper()})


# -- GEMMs -------------------------------------------------------------------------------------
def _scaled_mm(build) -> None:
    """int8 (int32 accumulator) and fp8 operands over every pick_config branch."""
    from lab.kernels import int8_gemm as ig

    fn = ig._scaled_mm_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")} | {"N", "K"}
    for q, acc_int in (("i8", True), ("fp8e4nv", False)):
        for i, m in enumerate((1, 64, 256, 4096)):  # decode, <= 64, <= 256, large
            out = DT16[i % 2]
            consts, opts = _tiles(ig.pick_config(m, 4096, 4096))
            consts.update(A_PER_ROW=i != 1, W_PER_COL=i != 2, HAS_BIAS=i != 3, ACC_INT=acc_int,
                          EVEN_K=i != 0)
            types = dict(a_ptr=f"*{q}", w_ptr=f"*{q}", c_ptr=f"*{out}", a_scale_ptr="*fp32",
                         w_scale_ptr="*fp32", bias_ptr=f"*{out}")
            ptx = _compile(build, fn, types, consts, aligned, **opts)
            assert ("wgmma" if consts["BLOCK_M"] >= 64 else "mma.sync") in ptx, (q, m, consts)


def _w4a16(build) -> None:
    from lab.kernels import w4a16_gemm as wq

    fn = wq._w4a16_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")} | {"N", "K"}
    for m, x, zeros in ((1, "bf16", True), (48, "fp16", False), (512, "bf16", False)):
        cfg = wq.pick_config(m, 14336, 4096, 128)
        split = cfg.pop("SPLIT_K")
        consts, opts = _tiles(cfg)
        consts.update(GROUP=128, HAS_ZEROS=zeros, HAS_BIAS=m != 48, SPLIT_K=split,
                      DOT_PRECISION="tf32")
        types = dict(x_ptr=f"*{x}", w_ptr="*u8", s_ptr="*fp32" if m == 48 else f"*{x}",
                     z_ptr="*u8" if zeros else f"*{x}", bias_ptr=f"*{x}",
                     c_ptr="*fp32" if split > 1 else f"*{x}")
        ptx = _compile(build, fn, types, consts, aligned, **opts)
        assert ("wgmma" if consts["BLOCK_M"] >= 64 else "mma.sync") in ptx, (m, x, consts)


def _split_k_reduce(build) -> None:
    from lab.kernels import w4a16_gemm as wq

    for out, bias in (("bf16", True), ("fp16", False)):
        _compile(build, wq._split_k_reduce_kernel,
                 dict(p_ptr="*fp32", bias_ptr=f"*{out}" if bias else "*fp32", c_ptr=f"*{out}"),
                 dict(SPLIT_K=2, HAS_BIAS=bias, BLOCK=1024), num_warps=4)


def _moe_gemm(build) -> None:
    """16-bit experts (decode mma, prefill wgmma) and 8-bit experts (fp8, int8) with scales."""
    from lab.kernels import fused_moe as fm

    fn = fm._moe_gemm_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")} | {"N", "K"}
    ints = {n: "*i32" for n in ("sorted_ptr", "expert_ids_ptr", "num_post_ptr")}
    for tokens, x, w in ((64, "bf16", "bf16"), (16384, "fp16", "fp16"), (64, "bf16", "fp8e4nv"),
                         (512, "fp16", "i8")):
        consts, opts = _tiles(fm.pick_config(tokens * 8, 128, 2048, 768))
        consts.update(TOP_K=8, MUL_ROUTED_WEIGHT=tokens != 64, B_SCALED=w != x, EVEN_K=True,
                      DOT_PRECISION="tf32")
        types = dict(ints, a_ptr=f"*{x}", b_ptr=f"*{w}", c_ptr=f"*{x}", w_ptr="*fp32",
                     s_ptr="*fp32")
        ptx = _compile(build, fn, types, consts, aligned, **opts)
        assert ("wgmma" if consts["BLOCK_M"] >= 64 else "mma.sync") in ptx, (tokens, w, consts)


# -- attention ---------------------------------------------------------------------------------
def _decode_split(build) -> None:
    from lab.kernels import paged_decode as pd

    fn = pd._decode_split_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")}
    aligned -= {"stride_os", "stride_ls"}
    # features: a sliding window, sinks and a soft cap (the layer's ATTENTION_FEATURES)
    for splits, hd, q, kv, features in ((1, 128, "bf16", "bf16", False),
                                        (8, 256, "fp16", "fp16", False),
                                        (4, 128, "bf16", "fp8e4nv", False),
                                        (1, 128, "bf16", "bf16", True),
                                        (4, 64, "bf16", "fp8e4nv", True)):
        consts, opts = _tiles(pd._launch_config(hd))
        fp8 = kv == "fp8e4nv"
        consts.update(NUM_SPLITS=splits, BLOCK_SIZE=16, BLOCK_G=16, HEAD_DIM=hd, BLOCK_D=hd,
                      STORE_LSE=splits > 1, DOT_PRECISION="tf32", KV_FP8=fp8,
                      SLIDING=features, SINKS=features, SOFTCAP=features)
        scale = "*fp32" if fp8 else "*i32"  # unused pointers are seq_lens
        types = dict(q_ptr=f"*{q}", k_ptr=f"*{kv}", v_ptr=f"*{kv}", seq_lens_ptr="*i32",
                     bt_ptr="*i32", o_ptr="*fp32" if splits > 1 else f"*{q}", lse_ptr="*fp32",
                     k_scale_ptr=scale, v_scale_ptr=scale, qk_scale="fp32",
                     sinks_ptr="*fp32" if features else "*i32", softcap="fp32")
        assert "mma.sync" in _compile(build, fn, types, consts, aligned, **opts), (splits, hd, kv)


def _merge_attn_states(build) -> None:
    from lab.kernels import merge_attn_states as ma

    fn = ma._merge_attn_states_kernel
    for out, hd, lse in (("bf16", 128, True), ("fp16", 256, False)):
        types = dict(po_ptr="*fp32", plse_ptr="*fp32", out_ptr=f"*{out}", lse_ptr="*fp32")
        consts = dict(po_sd=1, o_sd=1, BLOCK_S=16, HEAD_DIM=hd, BLOCK_D=hd, STORE_LSE=lse)
        _compile(build, fn, types, consts, set(types) | {"po_sb", "po_sh", "po_ss", "o_sb", "o_sh"},
                 num_warps=4 if hd >= 256 else 2)


def _paged_prefill(build) -> None:
    from lab.kernels import paged_prefill as pp

    fn = pp._paged_prefill_kernel
    # features: a sliding window, sinks and a soft cap (the layer's ATTENTION_FEATURES)
    for qlen, g, hd, q, kv, features in ((1, 4, 128, "bf16", "bf16", False),
                                         (2048, 8, 128, "fp16", "fp16", False),
                                         (512, 1, 256, "bf16", "bf16", False),
                                         (16, 4, 128, "bf16", "fp8e4nv", False),
                                         (2048, 8, 128, "bf16", "bf16", True),
                                         (16, 4, 64, "bf16", "fp8e4nv", True)):
        consts, opts = _tiles(pp.pick_config(qlen, g, hd, 2))
        fp8 = kv == "fp8e4nv"
        consts.update(G=g, BLOCK_Q=consts["BLOCK_M"] // g, HEAD_DIM=hd, BLOCK_SIZE=16,
                      DOT_PRECISION="tf32", KV_FP8=fp8, SLIDING=features, SINKS=features,
                      SOFTCAP=features)
        scale = "*fp32" if fp8 else "*i32"
        types = dict(q_ptr=f"*{q}", k_cache_ptr=f"*{kv}", v_cache_ptr=f"*{kv}", out_ptr=f"*{q}",
                     qsl_ptr="*i32", seq_lens_ptr="*i32", bt_ptr="*i32", k_scale_ptr=scale,
                     v_scale_ptr=scale, qk_scale="fp32",
                     sinks_ptr="*fp32" if features else "*i32", softcap="fp32")
        assert "mma" in _compile(build, fn, types, consts, **opts), (qlen, g, hd, kv)


def _mla_split(build) -> None:
    from lab.kernels import mla_decode as md

    fn = md._mla_split_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")}
    aligned -= {"stride_os", "stride_ls"}
    for heads, splits, q, kv in ((16, 1, "bf16", "bf16"), (128, 4, "fp16", "fp8e4nv")):
        consts, opts = _tiles(md._launch_config(heads))
        fp8 = kv == "fp8e4nv"
        consts.update(NUM_SPLITS=splits, BLOCK_SIZE=64, LORA=512, BLOCK_L=512, ROPE=64,
                      BLOCK_R=64, STORE_LSE=splits > 1, DOT_PRECISION="tf32", KV_FP8=fp8)
        scale = "*fp32" if fp8 else "*i32"
        types = dict(qn_ptr=f"*{q}", qp_ptr=f"*{q}", kv_ptr=f"*{kv}", seq_lens_ptr="*i32",
                     bt_ptr="*i32", o_ptr="*fp32" if splits > 1 else f"*{q}", lse_ptr="*fp32",
                     c_scale_ptr=scale, pe_scale_ptr=scale, qk_scale="fp32")
        ptx = _compile(build, fn, types, consts, aligned, **opts)
        assert ("wgmma" if consts["BLOCK_H"] >= 64 else "mma.sync") in ptx, (heads, kv)


# -- KV cache ----------------------------------------------------------------------------------
def _kv_cache_write(build) -> None:
    from lab.kernels import kv_cache_write as kw
    from lab.kernels import num_warps_for

    for h, d, x, cache in ((8, 128, "bf16", "bf16"), (2, 64, "fp16", "fp16"),
                           (8, 128, "bf16", "fp8e4nv")):
        fp8 = cache == "fp8e4nv"
        block_h = min(h, max(1, kw._MAX_TILE // d))
        block_t = kw._tokens_per_program(block_h * d)
        scale = "*fp32" if fp8 else "*i64"  # unused pointers are slot_mapping
        types = dict(k_ptr=f"*{x}", v_ptr=f"*{x}", k_cache_ptr=f"*{cache}",
                     v_cache_ptr=f"*{cache}", slot_ptr="*i64", k_scale_ptr=scale,
                     v_scale_ptr=scale)
        _compile(build, kw._kv_cache_write_kernel, types,
                 dict(BLOCK_SIZE=16, HEAD_DIM=d, BLOCK_H=block_h, BLOCK_T=block_t, FP8=fp8),
                 num_warps=num_warps_for(block_t * block_h * d))


def _latent_write(build) -> None:
    from lab.kernels import mla_cache_write as mw
    from lab.kernels import num_warps_for

    for x, cache in (("bf16", "bf16"), ("fp16", "fp8e4nv")):
        fp8 = cache == "fp8e4nv"
        width = 1024  # next_power_of_2(L + R) at DeepSeek's 512 + 64
        block_t = mw._MAX_TILE // width
        scale = "*fp32" if fp8 else "*i64"
        types = dict(c_ptr=f"*{x}", pe_ptr=f"*{x}", cache_ptr=f"*{cache}", slot_ptr="*i64",
                     c_scale_ptr=scale, pe_scale_ptr=scale)
        _compile(build, mw._latent_write_kernel, types,
                 dict(BLOCK_SIZE=64, BLOCK_T=block_t, BLOCK_W=width, FP8=fp8),
                 num_warps=num_warps_for(block_t * width))


def _copy_blocks(build) -> None:
    from lab.kernels import copy_blocks as cb

    for bits, ids in (("i16", "i64"), ("u8", "i32")):  # 16-bit and fp8 caches, as integers
        _compile(build, cb._copy_blocks_kernel,
                 dict(src_ptr=f"*{bits}", dst_ptr=f"*{bits}", src_ids_ptr=f"*{ids}",
                      dst_ids_ptr=f"*{ids}"), dict(BLOCK=2048), num_warps=4)


# -- elementwise and quantization ----------------------------------------------------------------
def _quantize(build) -> None:
    """int8 / fp8, per token / per tensor, one- and two-pass rows: the divisions are IEEE
    (`div.rn`, the bit-exact contract with the references), no approximate division."""
    from lab.kernels import quantize as qz

    for x, q, per_token, one_pass in (("bf16", "i8", True, True), ("fp16", "i8", True, False),
                                      ("bf16", "fp8e4nv", True, False),
                                      ("fp16", "fp8e4nv", False, True)):
        is_int = q == "i8"
        block = 1024 if one_pass else 4096
        ptx = _compile(build, qz._quantize_kernel,
                       dict(x_ptr=f"*{x}", q_ptr=f"*{q}", scale_ptr="*fp32", amax_ptr="*fp32"),
                       dict(QMAX=qz.INT8_MAX if is_int else qz.FP8_MAX, EPS_=qz.EPS,
                            PER_TOKEN=per_token, IS_INT=is_int, BLOCK=block, ONE_PASS=one_pass),
                       num_warps=block // 512)
        assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx


def _row_absmax(build) -> None:
    from lab.kernels import quantize as qz

    for x in DT16:
        _compile(build, qz._row_absmax_kernel, dict(x_ptr=f"*{x}", amax_ptr="*fp32"),
                 dict(BLOCK=4096), num_warps=8)


def _rms_norm(build) -> None:
    from lab.kernels import rmsnorm as rn

    fn = rn._rms_norm_kernel
    aligned = {n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride")}
    aligned.add("n_cols")  # hidden sizes are multiples of 16: 128-bit row accesses
    for x, res, bm, bn, warps in (("bf16", True, 1, 4096, 8), ("fp16", False, 16, 128, 4)):
        types = {n: f"*{x}" for n in fn.arg_names if n.endswith("_ptr")}
        types["eps"] = "fp32"
        ptx = _compile(build, fn, types, dict(HAS_RESIDUAL=res, BLOCK_M=bm, BLOCK_N=bn), aligned,
                       num_warps=warps)
        assert "ld.global.v4" in ptx, (x, res)


def _rotary(build) -> None:
    """With the wrapper's options no multiply-add is contracted into an fma (each product is
    rounded to the input dtype first, as HF does; module docstring)."""
    from lab.kernels import rotary as ro

    for x, neox, tail in (("bf16", True, 0), ("bf16", False, 32), ("fp16", True, 0),
                          ("fp16", False, 0)):
        types = {n: f"*{x}" for n in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr")}
        types.update(pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32")
        ptx = _compile(build, ro._rotary_kernel, types,
                       dict(HEAD_DIM=128 + tail, IS_NEOX=neox, BLOCK_H=32, BLOCK_R=64,
                            BLOCK_P=tail), num_warps=8, **ro.LAUNCH_OPTIONS)
        assert "fma.rn" not in ptx, (x, neox, "products fused into fma: HF rounds each one")


def _silu_and_mul(build) -> None:
    from lab.kernels import silu_and_mul as sm

    for x in DT16:
        _compile(build, sm._silu_and_mul_kernel, dict(x_ptr=f"*{x}", out_ptr=f"*{x}"),
                 dict(BLOCK=1024), num_warps=4)


# -- speculative decoding ----------------------------------------------------------------------
_REJECTION_PTRS = dict(out_ptr="*i64", draft_ptr="*i64", start_ptr="*i32", k_ptr="*i32",
                       greedy_ptr="*i8", target_ptr="*fp32", q_ptr="*fp32", uniform_ptr="*fp32",
                       exp_ptr="*fp32")


def _rejection_greedy(build) -> None:
    from lab.kernels import rejection as rj

    _compile(build, rj._greedy_kernel, _REJECTION_PTRS, dict(BLOCK=1024), num_warps=4)


def _rejection_random(build) -> None:
    """Draft probabilities and point masses: the races divide in IEEE (`div.rn`), as the
    reference, so the tokens are the reference's bit for bit."""
    from lab.kernels import rejection as rj

    for has_q in (True, False):
        ptx = _compile(build, rj._random_kernel, _REJECTION_PTRS, dict(HAS_Q=has_q, BLOCK=1024),
                       num_warps=4)
        assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx


# -- MoE alignment (int32 ids) -------------------------------------------------------------------
def _moe_align(build) -> None:
    from lab.kernels import moe_align as ma

    def ptrs(fn, ids="*i32"):
        return {n: ids if n == "ids_ptr" else "*i32" for n in fn.arg_names if n.endswith("_ptr")}

    # sizes below the largest (N_PAD 4096, CHUNK 2048: ~3 s each to compile, a sort of N_PAD keys)
    build(ma._align_single_kernel, ptrs(ma._align_single_kernel, "*i64"),
          dict(N_PAD=512, KEY_SHIFT=9, E_PAD=128, BLOCK_M=16, PAD_J=16, FILL=1024), num_warps=4)
    build(ma._align_count_kernel, ptrs(ma._align_count_kernel), dict(CHUNK=1024, E_PAD=128),
          num_warps=4)
    build(ma._align_scan_kernel, ptrs(ma._align_scan_kernel),
          dict(E_PAD=128, ROWS=32, BLOCK_M=64, PAD_J=32, FILL=1024), num_warps=4)
    build(ma._align_scatter_kernel, ptrs(ma._align_scatter_kernel, "*i64"),
          dict(CHUNK=ma.CHUNK, KEY_SHIFT=ma.CHUNK.bit_length() - 1, E_PAD=128, BLOCK_M=64),
          num_warps=4)


CASES: dict[str, Callable] = {
    "int8_gemm._scaled_mm_kernel": _scaled_mm,
    "w4a16_gemm._w4a16_kernel": _w4a16,
    "w4a16_gemm._split_k_reduce_kernel": _split_k_reduce,
    "fused_moe._moe_gemm_kernel": _moe_gemm,
    "paged_decode._decode_split_kernel": _decode_split,
    "merge_attn_states._merge_attn_states_kernel": _merge_attn_states,
    "paged_prefill._paged_prefill_kernel": _paged_prefill,
    "mla_decode._mla_split_kernel": _mla_split,
    "kv_cache_write._kv_cache_write_kernel": _kv_cache_write,
    "mla_cache_write._latent_write_kernel": _latent_write,
    "copy_blocks._copy_blocks_kernel": _copy_blocks,
    "quantize._quantize_kernel": _quantize,
    "quantize._row_absmax_kernel": _row_absmax,
    "rmsnorm._rms_norm_kernel": _rms_norm,
    "rotary._rotary_kernel": _rotary,
    "silu_and_mul._silu_and_mul_kernel": _silu_and_mul,
    "moe_align._align_kernels": _moe_align,
    "rejection._greedy_kernel": _rejection_greedy,
    "rejection._random_kernel": _rejection_random,
}
# The larger attention / GEMM kernels take ~1-3 s each to compile (cold Triton cache).
SLOW = {"mla_decode._mla_split_kernel", "paged_prefill._paged_prefill_kernel"}


def launched_kernels() -> set[str]:
    """'module.kernel' for every `kernel[grid](...)` launch in lab/kernels/*.py."""
    found = set()
    for path in sorted(KERNELS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name)):
                found.add(f"{path.stem}.{node.func.value.id}")
    return found


def _covered(case: str) -> set[str]:
    if case == "moe_align._align_kernels":
        return {f"moe_align._align_{s}_kernel" for s in ("single", "count", "scan", "scatter")}
    return {case}


def test_every_launched_kernel_has_a_case():
    covered = set().union(*(_covered(c) for c in CASES))
    launched = launched_kernels()
    assert launched, "no kernel launches found in lab/kernels"
    assert launched == covered, (f"without a case: {sorted(launched - covered)}; "
                                 f"not launched: {sorted(covered - launched)}")


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c
                                  for c in CASES])
def test_kernel_compiles_for_sm90(case):
    compile_for_sm90(f"""
        from tests.kernels.test_sm90_compile import CASES
        CASES[{case!r}](build)
        print("ok")
    """, TRITON_DEFAULT_FP_FUSION="1")
