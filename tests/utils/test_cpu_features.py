"""atroposlib.utils.cpu_features: native bf16 is read from the kernel's CPU flags."""

from __future__ import annotations

from atroposlib.utils.cpu_features import cpu_flags, cpu_model, native_bf16

X86 = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni{extra}\n\nprocessor\t: 1\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve{extra}\nCPU implementer\t: 0x41\n"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_x86_flags_decide(tmp_path):
    without = _write(tmp_path, "no_bf16", X86.format(extra=""))
    assert "avx512f" in cpu_flags(without) and not native_bf16(without)
    assert native_bf16(_write(tmp_path, "avx512_bf16", X86.format(extra=" avx512_bf16")))
    assert native_bf16(_write(tmp_path, "amx", X86.format(extra=" amx_tile amx_bf16")))
    assert cpu_model(without) == "Intel(R) Xeon(R) Processor"


def test_arm_features_and_unreadable_files(tmp_path):
    assert native_bf16(_write(tmp_path, "arm_bf16", ARM.format(extra=" bf16 i8mm")))
    assert not native_bf16(_write(tmp_path, "arm", ARM.format(extra="")))
    missing = str(tmp_path / "absent")
    assert cpu_flags(missing) == frozenset() and not native_bf16(missing)
    assert not native_bf16(_write(tmp_path, "empty", "processor\t: 0\n"))
