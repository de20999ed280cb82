"""Models through the C client (libascendcl/src/mdl.c) against real aclservers (emulated backend).

``tests/c/samples/model_inference.cpp`` — the classification sample's shape: sizes, load, desc,
datasets, N executions with outputs checked, unload — loads the model every CANN way (file,
memory, with the application's memory, with a config handle), executes synchronously and on a
stream, is held to the share's memory (a model that does not fit fails at load with 207001) and,
as two fixed 30/70 tenants on one die, to the compute quota, measured by the aclservers' own
accounting (the die microseconds each was granted over a window).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flexnpu_client import Session
from flexnpu_testing import aclserver_harness, clibrary
from flexnpu_wire import clientconf
from flexnpu_wire.ops import Op
from tests.c import sample_models
from tests.c.conftest import HERE, MIB, Claim, Interactive, run

MODEL = sample_models.classifier()


@pytest.fixture(scope="module")
def infer(library: Path) -> Path:
    return clibrary.compile_program(HERE / "samples" / "model_inference.cpp", link_library=library)


@pytest.mark.parametrize("how", ["file", "mem", "withmem", "config"])
@pytest.mark.parametrize("mode", ["sync", "async", "v2", "v2-no-stream", "async-v2"])
def test_the_inference_sample(infer: Path, claim: Claim, tmp_path: Path, how: str, mode: str) -> None:
    path = sample_models.write(tmp_path / "classifier.fnm", MODEL)
    res = run(infer, "infer", str(path), "5", how, mode, conf=claim.conf).ok()
    v = res.values
    assert (v["load_code"], v["n_inputs"], v["n_outputs"]) == ("0", "1", "2"), res.stdout
    assert (
        int(v["input_size"]) == MODEL.input_size(0) and v["input_name"] == "image" and v["input_dims"] == "4"
    )
    assert v["executions"] == "5" and int(v["checked"]) == 5 * MODEL.inputs[0].elements()
    assert float(v["out1_sum"]) == pytest.approx(sample_models.expected_out1_sum(MODEL, 4), rel=1e-6)
    if how == "withmem":
        assert (int(v["work_size"]), int(v["weight_size"])) == (MODEL.work_bytes, MODEL.weight_bytes)
    assert "[INFO] 0 failed" in res.stdout


def test_a_model_larger_than_the_share_fails_at_load_with_207001(
    infer: Path, claim: Claim, tmp_path: Path
) -> None:
    big = sample_models.classifier(work_bytes=64 * MIB)  # the share has 64 MiB; weights come on top
    res = run(infer, "load", str(sample_models.write(tmp_path / "big.fnm", big)), conf=claim.conf)
    assert res.rc == 0 and res.values["load_code"] == "207001", res.stdout
    assert "exceeds the memory quota" in res.values["load_msg"] and "work memory" in res.values["load_msg"]
    with Session.open(claim.server.conf()) as s:
        s.init()
        s.set_device(0)
        assert s.get_mem_info() == (64 * MIB, 64 * MIB), "nothing of the failed load is held"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        pytest.param(("load", "/nonexistent/model.fnm"), "100014", id="missing-file"),
        pytest.param(("load", "/dev/null"), "100014", id="not-a-regular-file"),
        pytest.param(("load", "{garbage}"), "100013", id="not-a-model"),
    ],
)
def test_bad_model_files(infer: Path, claim: Claim, tmp_path: Path, args: tuple[str, str], code: str) -> None:
    garbage = tmp_path / "garbage.fnm"
    garbage.write_bytes(b"\x7fELF not a model " * 64)
    res = run(infer, args[0], args[1].replace("{garbage}", str(garbage)), conf=claim.conf)
    assert res.values["load_code"] == code, res.stdout


def test_two_fixed_tenants_executing_models_get_30_and_70_percent(infer: Path, tmp_path: Path) -> None:
    """Two claims on one die, fixed 30 % and 70 %, each running the sample's tenant loop (20 ms of die
    per execution, two streams kept queued): over a 4 s window the die time the aclservers granted
    them (their own accounting, not the clock) splits 30/70 within 3 points."""
    model = sample_models.write(tmp_path / "tenant.fnm", sample_models.classifier(cost_us=20_000))
    ledger = str(tmp_path / "ledger")
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=64 * MIB, compute=30)], ledger_dir=ledger
    ) as low, aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=64 * MIB, compute=70)], ledger_dir=ledger
    ) as high:  # fmt: skip
        confs = []
        for server in (low, high):
            conf = tmp_path / f"{server.spec.claim_uid}.conf"
            conf.write_text(clientconf.render(server.conf()))
            confs.append(conf)
        tenants = [Interactive(infer, "tenant", str(model), "12", conf=c) for c in confs]
        try:
            with Session.open(low.conf()) as a, Session.open(high.conf()) as b:
                a.init()
                b.init()
                used: Callable[[Session], int] = lambda s: s.call(Op.GET_USAGE, 0)[2]  # noqa: E731
                aclserver_harness.wait_for(lambda: used(a) > 0 and used(b) > 0, what="both tenants running")
                window = threading.Event()
                window.wait(1.0)  # warm-up, then a measurement window: neither is a synchronisation
                start, t0 = (used(a), used(b)), time.monotonic()
                window.wait(4.0)
                end, t1 = (used(a), used(b)), time.monotonic()
            used_us = [e - s for s, e in zip(start, end, strict=True)]
            split = [u / sum(used_us) for u in used_us]
            assert abs(split[0] - 0.30) <= 0.03 and abs(split[1] - 0.70) <= 0.03, split
            # and neither starves: of the window's die time, each got its quota within the host
            # jitter the kernel tests allow (tests/integration/test_aclserver_quota.py)
            of_window = [u / 1e6 / (t1 - t0) for u in used_us]
            assert of_window[0] >= 0.20 and of_window[1] >= 0.60 and sum(of_window) <= 1.01, of_window
        finally:
            for t in tenants:
                t.proc.kill()
                t.proc.wait()


@pytest.fixture(scope="module")
def exec_config(library: Path) -> Path:
    return clibrary.compile_program(HERE / "exec_config.c", link_library=library)


def test_the_execution_config_handle_and_its_refusals(exec_config: Path) -> None:
    run(exec_config, "config", conf=None).ok()


def test_execute_v2_on_a_stream_honours_the_stream_timeout(
    exec_config: Path, claim: Claim, tmp_path: Path
) -> None:
    slow = sample_models.write(tmp_path / "slow.fnm", sample_models.classifier(cost_us=1_000_000))
    run(exec_config, "timeout", str(slow), conf=claim.conf).ok()
