"""The launcher's pure parts: --device resolution, the child's environment, shell exit codes."""

from __future__ import annotations

import pytest
from .test_records import DEVICES, grant

from gpuslice.local.launcher import child_environment, resolve_devices, shell_code
from gpuslice.spec import SpecError


def test_resolve_devices_by_index_and_uuid():
    assert resolve_devices("1,0", DEVICES) == (DEVICES[1].uuid, DEVICES[0].uuid)
    assert resolve_devices(DEVICES[3].uuid, DEVICES) == (DEVICES[3].uuid,)
    assert resolve_devices(None, DEVICES) == ()
    with pytest.raises(SpecError) as err:
        resolve_devices("8", DEVICES)
    assert err.value.field == "device" and "0, 1" in err.value.allowed


def test_child_environment_prepends_the_enforcer(tmp_path):
    env = child_environment(grant(tmp_path), "/lib/libgpuslice.so", {"LD_PRELOAD": "/other.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == "/lib/libgpuslice.so /other.so"
    assert env["CUDA_VISIBLE_DEVICES"] == DEVICES[0].uuid and env["GPUSLICE_SLICE"] == str(tmp_path / "slice")


def test_shell_codes():
    assert shell_code(3) == 3 and shell_code(-15) == 143 and shell_code(-9) == 137


def test_a_device_name_no_node_could_have_is_a_usage_error():
    """--device takes indexes and NVML's UUIDs (GPU-…, MIG-…, the older MIG-GPU-<uuid>/<gi>/<ci>); anything else is
    wrong on every node, so it is refused before any node is asked (exit 2), naming the field and what it takes."""
    from gpuslice.local.launcher import device_names

    assert device_names("1, 0") == ["1", "0"] and device_names(None) == []
    assert device_names(f"{DEVICES[3].uuid},MIG-GPU-5f1d2a3b-aaaa-bbbb-cccc-0123456789ab/1/0")[1].endswith("/1/0")
    for bad in ("abc", "0,,1", "0,", "-1", "GPU-", "gpu 0", "\u0661"):  # an Arabic-Indic one: not an index
        with pytest.raises(SpecError) as err:
            device_names(bad)
        assert err.value.field == "device" and "device indexes (0,1) or UUIDs" in err.value.allowed


def test_a_command_line_of_bytes_that_are_not_utf8_is_recorded_as_text_any_answer_can_carry():
    """Python hands argv bytes that are not UTF-8 over as surrogate escapes; recorded as they are, no JSON answer
    or table holding them could be encoded (helper 42). They are recorded as U+FFFD."""
    from gpuslice.local.launcher import command_text

    text = command_text(["python", "caf\udce9.py", "--x"])
    assert text == "python 'caf\ufffd.py' --x" and text.encode("utf-8")
    assert len(command_text(["x" * 600])) == 500
