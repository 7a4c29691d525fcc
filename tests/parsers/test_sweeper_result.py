import json

from sweeper.parsers.sweeper_result import parse, parse_summary
from sweeper.result import CheckResult, Result

NOW = 1_790_000_000.0


def doc(**over: object) -> str:
    r = Result(node="n1", source="sweeper-check", started=NOW, finished=NOW,
               checks=(CheckResult("gpu.count", "pass", "8 GPUs"), CheckResult("xid", "fail", "XID 79", "fatal", 3, "79")))
    d = r.to_dict()
    d.update(over)
    return json.dumps(d)


def test_a_full_document_round_trips() -> None:
    r = parse("some log line before\n" + doc(), "n1", NOW)
    assert r.status == "fail"
    assert [(c.name, c.gpu, c.code) for c in r.checks] == [("gpu.count", None, None), ("xid", 3, "79")]


def test_bad_input_is_an_error_never_a_pass() -> None:
    cases = ["", "   \n", "garbage <<>>", "{not json", doc()[: len(doc()) // 2], json.dumps([1, 2]),
             doc(schema="other/v9"), doc(status="pass"), doc(checks=[]), doc(node="someone-else"),
             doc(checks=[{"name": "x", "status": "great"}]), "x" * (9 * 1024 * 1024)]
    for text in cases:
        r = parse(text, "n1", NOW)
        assert r.status == "error", text[:60]
        assert all(c.status == "error" for c in r.checks)


def test_summary_form() -> None:
    r = Result(node="n1", source="s", started=NOW, finished=NOW,
               checks=(CheckResult("row_remap", "fail", "pending", "critical", 5, "REMAP_PENDING"),))
    back = parse_summary(r.summary(), "n1", NOW)
    assert back.status == "fail" and back.checks[0].code == "REMAP_PENDING"
    ok = Result(node="n1", source="s", started=NOW, finished=NOW, checks=(CheckResult("a", "pass"),))
    assert parse_summary(ok.summary(), "n1", NOW).status == "pass"
    assert parse_summary("Segmentation fault", "n1", NOW).status == "error"


def test_summary_stays_under_the_termination_message_cap() -> None:
    checks = tuple(CheckResult("xid", "fail", "x" * 200, "critical", i % 8, "79") for i in range(200))
    r = Result(node="n1", source="s", started=NOW, finished=NOW, checks=checks)
    text = r.summary()
    assert len(text.encode()) <= 3500 and json.loads(text)["truncated"] is True
