from dataclasses import replace
from pathlib import Path
from tests.conftest import TEST_CONFIG, run_sweep

STANDIN = """name: stand-in pair
pair: true
tasks:
  - name: node-local checks of node A
    run_job: {template: sweeper-check.yaml.j2, timeout: 15m}
    register: a
    ignore_errors: true
  - name: verdict
    decide: {results: ["{{ a }}"]}
"""

def test_standin(make_sim, history, tmp_path: Path):
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "standin.yaml").write_text(STANDIN)
    sim = make_sim(nodes=6, faults={"gpu-00": {"xids": [{"code": 79, "gpu": 2}]}})
    cfg = replace(TEST_CONFIG, playbook="standin.yaml", playbook_dir=str(tmp_path / "pb"), max_nodes=4, light_playbook="")
    r = run_sweep(sim, history, cfg)
    for o in r.outcomes:
        print(o.node, o.verdict, o.action, o.reasons)
    for row in history.db.query("select * from pairs"):
        print(row)
    for e, d in r.events:
        if e in ("done", "log"): print(e, d)
