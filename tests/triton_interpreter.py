"""What the tests change in Triton's interpreter, and why (tests/conftest.py applies it)."""


def patch_the_language_once_per_launch() -> bool:
    """Triton's interpreter points `triton.language`'s builtins at its numpy implementations when a
    launch starts (`_patch_lang`) and back when it ends; it does it again for every call of a
    `@triton.jit` helper inside the launch (`InterpretedFunction.__call__`), where the language is
    patched already: an `inspect.getmembers` walk of four modules that changes nothing (the
    builtins it finds are the launch's wrappers, no longer builtins; the rest it sets to what it
    is) and whose scope nobody restores, ~1 ms a call; tests/kernels and the Triton engine runs
    spent ~15% of their CPU on it (78 -> 64 CPU-s). Here a helper whose `triton.language` modules
    the launch patched skips that walk; any other helper, and every launch, goes through
    Triton's `_patch_lang`. Returns False, leaving the interpreter as it is, on a Triton without
    these names. tests/kernels/test_interpreter_patching.py checks it."""
    try:
        from triton.runtime import interpreter
        launch, empty = interpreter.GridExecutor.__call__, interpreter._LangPatchScope
        interpreter._patch_lang  # noqa: B018 (the seam must exist)
    except (ImportError, AttributeError):
        return False
    if launch.__name__ == "launch_patching_once":
        return True  # applied already
    langs = (interpreter.tl, interpreter.tl.core)

    def langs_of(fn) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if any(v is lang for lang in langs)}

    def launch_patching_once(self, *args, **kwargs):
        patch, patched = interpreter._patch_lang, set[int]()

        def patch_unless_patched(fn):
            mine = langs_of(fn)
            if patched and mine <= patched:
                return empty()  # nothing to do, nothing to restore
            patched.update(mine)
            return patch(fn)

        interpreter._patch_lang = patch_unless_patched
        try:
            return launch(self, *args, **kwargs)
        finally:
            interpreter._patch_lang = patch

    launch_patching_once.__wrapped_launch__ = launch  # Triton's, for the test that counts it
    interpreter.GridExecutor.__call__ = launch_patching_once
    return True
