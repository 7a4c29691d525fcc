"""DCGM diag JSON (4.x and the 3.x layouts) and nccl-tests tables, one fixture per shape."""

import json
from pathlib import Path

import pytest

from sweeper.parsers import dcgm, nccl

FIX = Path(__file__).parent / "fixtures"
NOW = 1_800_000_000.0


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_dcgm_4x_pass() -> None:
    r = dcgm.parse(read("dcgm-4x-l2-pass.json"), "n1", NOW, exit_code=0, expect_gpus=2)
    assert r.status == "pass"
    assert {(c.name, c.gpu) for c in r.checks} >= {("dcgm.software", 0), ("dcgm.pcie", 1), ("dcgm.memory", 1)}
    bw = {(m.name, m.gpu): m.value for m in r.metrics}
    assert bw[("dcgm.pcie.gpu_to_host_bandwidth", 0)] == 53.21


def test_dcgm_4x_failure_and_the_pass_that_carries_an_isolate_error() -> None:
    r = dcgm.parse(read("dcgm-4x-l2-pcie-fail.json"), "n1", NOW, exit_code=205)
    fails = {(c.name, c.gpu, c.code, c.severity) for c in r.checks if c.status == "fail"}
    assert ("dcgm.pcie", 1, "3", "critical") in fails
    assert ("dcgm.memory", 0, "52", "critical") in fails, "decided on error_id, not only on status"
    assert r.status == "fail"


def test_dcgm_3x_layouts() -> None:
    r = dcgm.parse(read("dcgm-3x-mixed.json"), "n1", NOW, exit_code=226, expect_gpus=2)
    persist = next(c for c in r.checks if c.name == "dcgm.persistence_mode")
    assert (persist.status, persist.gpu, persist.code) == ("fail", 0, "29")
    assert "Persistence mode for GPU 0 is disabled." in persist.message
    assert next(c for c in r.checks if c.name == "dcgm.pcie" and c.gpu == 1).status == "pass"
    old = dcgm.parse(read("dcgm-31-string-warnings.json"), "n1", NOW)
    mem = next(c for c in old.checks if c.gpu == 0)
    assert mem.status == "fail" and "double-bit" in mem.message


def test_dcgm_gpu_count_against_the_profile() -> None:
    r = dcgm.parse(read("dcgm-4x-l2-pass.json"), "n1", NOW, expect_gpus=8)
    assert next(c for c in r.checks if c.name == "dcgm.gpu_count").status == "fail"


def test_dcgm_iterations_wrapper() -> None:
    one = read("dcgm-4x-l2-pass.json")
    r = dcgm.parse('{"iterations": [' + one + "," + read("dcgm-4x-l2-pcie-fail.json") + '], "Overall Result": "Fail"}',
                   "n1", NOW)
    assert r.status == "fail"
    assert any(c.message.startswith("iteration 2:") and c.status == "fail" for c in r.checks)


@pytest.mark.parametrize("text,exit_code,words", [
    ("", None, "printed nothing"),
    ("Error: unable to connect to host engine", 255, "no JSON object"),
    ('{"something": "else"}', None, "neither"),
    ('{"DCGM Diagnostic": {"test_categories": []}}', 0, "no results"),
    ('{"DCGM Diagnostic": {"test_categories": [', None, "not JSON"),
    ('{"DCGM Diagnostic": {"test_categories": "oops"}}', 0, "unexpected"),
])
def test_dcgm_bad_input_is_an_error(text: str, exit_code: int | None, words: str) -> None:
    r = dcgm.parse(text, "n1", NOW, exit_code=exit_code)
    assert r.status == "error" and words in r.checks[0].message


def test_dcgm_runtime_error_and_exit_code_cross_checks() -> None:
    r = dcgm.parse(read("dcgm-runtime-error.json"), "n1", NOW, exit_code=217)
    assert r.status == "error" and "already running" in r.checks[0].message
    lie = dcgm.parse(read("dcgm-4x-l2-pass.json"), "n1", NOW, exit_code=226)
    assert lie.status == "error" and "exited 226" in lie.checks[0].message
    crash = dcgm.parse(read("dcgm-4x-l2-pass.json"), "n1", NOW, exit_code=139)
    assert crash.status == "error"


def test_nccl_table_uses_the_largest_size() -> None:
    r = nccl.parse(read("nccl-allreduce-h100.txt"), "n1", NOW, min_busbw=430)
    m = {x.name: x.value for x in r.metrics}
    assert m["nccl.busbw_largest"] == 453.20 and m["nccl.busbw_avg"] == 178.222
    assert r.status == "pass"
    low = nccl.parse(read("nccl-allreduce-h100.txt"), "n1", NOW, min_busbw=460)
    assert low.status == "fail" and next(c for c in low.checks if c.name == "nccl.busbw").code == "LOW_BANDWIDTH"


def test_nccl_prefixes_old_columns_and_failures() -> None:
    assert nccl.parse(read("nccl-allreduce-mpi-prefix.txt"), "n1", NOW, min_busbw=430).status == "pass"
    old = nccl.parse(read("nccl-old-error-column.txt"), "n1", NOW)
    assert old.status == "pass" and {m.name: m.value for m in old.metrics}["nccl.busbw_largest"] == 197.83
    truncated = nccl.parse(read("nccl-truncated.txt"), "n1", NOW)
    assert truncated.status == "fail" and any(c.code == "TRUNCATED" for c in truncated.checks)
    wrong = nccl.parse(read("nccl-wrong-values.txt"), "n1", NOW)
    assert {c.code for c in wrong.checks if c.status == "fail"} == {"WRONG", "OOB"}


@pytest.mark.parametrize("text", ["", "garbage\n\x00\x01", "# only comments\n#\n", "8 2 float sum -1 x y z 0 1 2 3 4\n"])
def test_nccl_bad_input_is_an_error(text: str) -> None:
    assert nccl.parse(text, "n1", NOW).status == "error"


# -- as people paste it -------------------------------------------------------------------
def _one_result(status: object) -> str:
    import json

    return json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": status}]}]}]}})


@pytest.mark.parametrize("status", ["Banana", None, 1, "", ["Pass"]])
def test_dcgm_a_status_outside_its_set_is_an_error_naming_it(status: object) -> None:
    r = dcgm.parse(_one_result(status), "n1", NOW)
    assert r.status == "error" and repr(status) in r.checks[0].message


def test_dcgm_json_as_it_really_comes() -> None:
    """A preamble line, literal nulls, gpu_ids as a string and as an integer, any case of status."""
    text = ('Defaulted container "nvidia-dcgm-ctr" out of: nvidia-dcgm-ctr, toolkit-validation (init)\n'
            '{"DCGM GPU Diagnostic": {"test_categories": [null, {"category": "Hardware", "tests": [null,\n'
            ' {"name": "GPU Memory", "results": [null, {"gpu_ids": "0", "status": "pass"},\n'
            '  {"gpu_ids": 1, "status": "FAIL", "warnings": [{"warning": "DBE on GPU 1", "error_id": 52}]}]}]}]}}\n')
    r = dcgm.parse(text, "n1", NOW)
    assert [(c.gpu, c.status) for c in r.checks] == [(0, "pass"), (1, "fail")]
    assert r.checks[1].code == "52"


# DCGM 4.x prints a per-GPU row under each test (NVIDIA/DCGM#253); 3.x prints "Fail - GPU: 0"
# and a "Warning" row whose text wraps at the cell's width (NVIDIA/go-dcgm#52).
TABLE_4X = """+-----  Hardware  ----------+------------------------------------------------+
| memory                    | Fail                                           |
|                           | GPU0: Pass                                     |
|                           | GPU1: Fail                                     |
| Warning: GPU1             | Detected 2 volatile DBE on GPU 1.              |
+-----  Stress  ------------+------------------------------------------------+
| memory_bandwidth          | Skip                                           |
"""
TABLE_3X_BARE = """PCIe                          Pass - All
GPU Memory                    Fail - GPU: 2
                              Pass - GPUs: 0, 1, 3
"""


def test_dcgm_table_read_per_gpu_in_both_layouts_with_or_without_borders() -> None:
    r = dcgm.parse(TABLE_4X, "n1", NOW)
    assert [(c.name, c.gpu, c.status) for c in r.checks] == [
        ("dcgm.memory", 0, "pass"), ("dcgm.memory", 1, "fail"), ("dcgm.memory_bandwidth", None, "skip")]
    assert "DBE" in r.checks[1].message
    bare = dcgm.parse(TABLE_3X_BARE, "n1", NOW)
    assert {(c.name, c.gpu, c.status) for c in bare.checks} == {
        ("dcgm.pcie", None, "pass"), ("dcgm.gpu_memory", 2, "fail"), ("dcgm.gpu_memory", 0, "pass"),
        ("dcgm.gpu_memory", 1, "pass"), ("dcgm.gpu_memory", 3, "pass")}
    odd = dcgm.parse(TABLE_4X.replace("| memory_bandwidth          | Skip ", "| memory_bandwidth          | Maybe"),
                     "n1", NOW)
    assert any(c.status == "error" and "Maybe" in c.message for c in odd.checks)


# mpirun --tag-output puts "[job,rank]<stdout>:" before each line (Open MPI's mpirun(1) man page).
RANKED = """  [1,0]<stdout>:# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20
  [1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
  [1,0]<stdout>:           8             2     float     sum      -1    30.11    0.00    0.00      0    29.85    0.00    0.00      0
  ...
  [1,0]<stdout>:  8589934592    2147483648     float     sum      -1    47078  182.46  364.57      0    46939  183.00  365.65      0
  [1,0]<stdout>:# Out of bounds values : 0 OK
  [1,0]<stdout>:# Avg bus bandwidth    : 120.5
"""


def test_nccl_rank_tagged_indented_and_elided_rows_with_both_bandwidths() -> None:
    r = nccl.parse(RANKED, "n1", NOW, min_busbw=300)
    assert r.status == "pass", r.checks
    m = {x.name: x.value for x in r.metrics}
    assert (m["nccl.busbw_oop_largest"], m["nccl.busbw_ip_largest"]) == (364.57, 365.65)


def test_nccl_a_run_that_aborted_is_a_failed_test_with_its_reason() -> None:
    text = ("# Using devices\n"
            "host1: Test CUDA failure common.cu:892 'CUDA-capable device(s) is/are busy or unavailable'\n"
            " .. host1 pid 77: Test failure common.cu:891\n")
    r = nccl.parse(text, "n1", NOW)
    assert r.status == "fail"
    assert [c.code for c in r.checks] == ["ABORTED"] and "busy or unavailable" in r.checks[0].message


# DCGM 4.x prints a test's own result above its per-GPU rows, and the two can disagree: `pcie` Fail
# while every GPU row says Pass (NVIDIA/DCGM#253). The messages below follow DCGM's own templates in
# dcgmlib/dcgm_errors.h: DCGM_FR_PCIE_GENERATION (45), DCGM_FR_PENDING_ROW_REMAP (85) and
# DCGM_FR_INTERNAL (44, "There was an internal error during the test: '%s'", category 16, INTERNAL_OTHER).
def table_253(test: str, overall: str, label: str, message: str) -> str:
    rows = "".join(f"|                           | GPU{g}: Pass{' ' * 37}|\n" for g in range(4))
    return ("|-----  Integration  -------+------------------------------------------------|\n"
            f"| {test:<25} | {overall:<46} |\n" + rows + f"| {label:<25} | {message:<46} |\n")


def test_dcgm_a_test_level_fail_over_passing_gpu_rows_is_never_a_pass() -> None:
    named = dcgm.parse(table_253("pcie", "Fail", "Warning", "GPU 1 is running at PCI link generation 1"), "n1", NOW)
    assert named.status == "fail"
    assert [(c.gpu, c.status) for c in named.checks] == [(0, "pass"), (2, "pass"), (3, "pass"), (1, "fail")]
    unnamed = dcgm.parse(table_253("pcie", "Warn", "Warning", "Link bandwidth below the minimum"), "n1", NOW)
    assert unnamed.status == "warn" and (unnamed.checks[-1].gpu, unnamed.checks[-1].status) == (None, "warn")
    own = dcgm.parse(table_253("pcie", "Fail", "Warning", "There was an internal error during the test"), "n1", NOW)
    assert own.status == "error" and own.checks[-1].code == "DCGM_INTERNAL"


def test_dcgm_an_error_row_that_names_a_gpu_fails_that_gpu() -> None:
    text = table_253("memory", "Pass", "Error", "GPU 3 had memory errors and row remappings are pending")
    r = dcgm.parse(text, "n1", NOW)
    assert r.status == "fail"
    assert {c.gpu for c in r.checks if c.status == "fail"} == {3}
    assert "row remappings are pending" in next(c for c in r.checks if c.gpu == 3).message


def summary_only(status: str, warning: dict[str, object]) -> str:
    results = [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": g, "status": "Pass"} for g in range(2)]
    return json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Integration", "tests": [
        {"name": "pcie", "results": results, "test_summary": {"status": status, "warnings": [warning]}}]}]}})


def test_dcgm_json_test_summary_fail_over_passing_entities() -> None:
    """With -j the same disagreement is test_summary.status against the entities' own results."""
    r = dcgm.parse(summary_only("Fail", {"error_id": 45, "error_category": 13, "error_severity": 4,
                                         "warning": "GPU 0 is running at PCI link generation 1"}), "n1", NOW)
    assert r.status == "fail" and [(c.gpu, c.status, c.code) for c in r.checks if c.status == "fail"] == [(0, "fail", "45")]
    own = dcgm.parse(summary_only("Fail", {"error_id": 44, "error_category": 16, "error_severity": 3,
                                           "warning": "There was an internal error during the test: 'no json'"}),
                     "n1", NOW)
    assert own.status == "error" and own.checks[-1].code == "DCGM_INTERNAL"
    words = dcgm.parse(summary_only("Fail", {"warning": "Couldn't parse json output from the child"}), "n1", NOW)
    assert words.status == "error"


def test_nccl_one_rank_measures_no_link() -> None:
    """Captured on a real H100 (nccl-tests 2.19.6, NCCL 2.28.9, one GPU): all_reduce's bus bandwidth is 0 with
    one rank (busbw = algbw * 2(n-1)/n), and sendrecv to itself in place is a no-op that reports 194,233 GB/s.
    A floor judged on either would fail a healthy node or pass a broken link."""
    real = Path(__file__).parent / "fixtures" / "real"
    one = nccl.parse((real / "nccl-h100-allreduce-one-rank-floor.txt").read_text(), "n1", NOW, min_busbw=300)
    floor = next(c for c in one.checks if c.name == "nccl.busbw")
    assert one.status == "error" and floor.status == "error" and floor.code == "ONE_RANK"
    assert nccl.parse((real / "nccl-h100-allreduce-one-rank-floor.txt").read_text(), "n1", NOW).status == "pass"
    selfcopy = nccl.parse((real / "nccl-h100-sendrecv-one-rank.txt").read_text(), "n1", NOW)
    m = {x.name: x.value for x in selfcopy.metrics}
    assert m["nccl.busbw_largest"] == 1314.7 and m["nccl.busbw_ip_largest"] == 194233
    floor = nccl.parse((real / "nccl-h100-sendrecv-one-rank.txt").read_text(), "n1", NOW, min_busbw=300)
    assert floor.status == "error" and any(c.code == "ONE_RANK" for c in floor.checks)
    # Several ranks listed (eight here): the floor is judged as before.
    assert nccl.parse(read("nccl-allreduce-h100.txt"), "n1", NOW, min_busbw=460).status == "fail"


def test_the_pair_image_on_a_real_gpu_that_is_not_there_aborts_on_the_node() -> None:
    """images/nccl-pair's allreduce_bench.py run by torchrun with two ranks on a machine of one H100
    (torch 2.11, NCCL 2.28.9): rank 1 asks for a GPU the node lacks, and torch says so in its own
    words ("torch.AcceleratorError: CUDA error: invalid device ordinal"); rank 0 is stopped. The pair
    reader fails the pair as aborted and quotes CUDA, never passes it."""
    from sweeper.parsers import pair
    log = (Path(__file__).parent / "fixtures" / "pair-bench-h100-second-gpu-missing.txt").read_text()
    r = pair.parse(["", log], "n1", NOW, partner="n2", exit_codes=[1, 1], min_busbw=300)
    assert r.status == "fail" and any(c.code == "ABORTED" and "invalid device ordinal" in c.message for c in r.checks)
