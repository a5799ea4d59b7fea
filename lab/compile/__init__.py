"""`compile=true`: the model through torch.compile with attention (and MoE) as opaque custom
ops (lab/compile/opaque_ops.py), compiled once for a dynamic token count
(lab/compile/compiler.py). See docs/compile.md."""

from lab.compile.compiler import CompiledForward, CompileOptions, compile_model, warmup_sizes

__all__ = ["CompileOptions", "CompiledForward", "compile_model", "warmup_sizes"]
