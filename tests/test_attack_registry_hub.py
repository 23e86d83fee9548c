"""The listed-architecture checks through the Hub path (local Hub server, real huggingface_hub client): a repo whose
config.json lists no class vLLM registers, with a name that tries to forge an output line, gets the same verdict as
the local folder, and `hub fix` refuses in one line, writing nothing to the Hub."""

from __future__ import annotations

import json

from tests.hub_workflow_helpers import SRC, commits, hub, hub_env, run, uploads  # noqa: F401 - fixtures
from tests.test_doctor_load_refused import DBRX, write_dbrx

LISTED = ["NotARealForCausalLM", "DbrxModel\nerror: forged"]


def test_doctor_and_hub_fix_judge_a_hub_repo_as_the_folder(hub, capsys, tmp_path):
    folder = write_dbrx(tmp_path / "src", quantized=True, config=dict(DBRX, architectures=LISTED))
    hub.add_repo(SRC, folder)
    local = json.loads(run(capsys, "doctor", folder, "--json", "--target", "vllm==0.32.0")[1])
    code, out, err = run(capsys, "doctor", SRC, "--json", "--target", "vllm==0.32.0")
    remote = json.loads(out)
    assert code == 1 and [f["code"] for f in remote["findings"]] == [f["code"] for f in local["findings"]]
    assert "unregistered-architecture" in [f["code"] for f in remote["findings"]]
    code, out, err = run(capsys, "doctor", SRC, "--target", "vllm==0.32.0")
    assert not [line for line in out.splitlines() if line.startswith("error: forged")], out
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--target", "vllm==0.32.0")
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and "[unregistered-architecture]" in line and "nothing was written" in line, err
    assert not [x for x in (out + err).splitlines() if x.startswith("error: forged")] and not uploads(hub)
    assert not commits(hub, "alice/fixed")
