"""`ckpt-repair hub fix`: repair a Hub model without downloading all of it.

resolve SRC@REV to a sha -> plan from remote headers (+ scale ranges) -> check the destinations
(an open PR with this fix? a fork that already has it?) -> fork DST server-side -> per changed
shard: download, rewrite, pre-upload, delete -> small files, report, card -> ONE commit on the
fork (parent = its head) and/or a pull request on SRC (parent = the pinned sha).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from repair.doctor.diagnose import diagnose_each
from repair.errors import RepairError, UsageError
from repair.execute.report import REPORT_NAME, Sections, build_report, input_sections, recipe_options
from repair.execute.parallel import default_jobs
from repair.execute.writer import check_inputs, refuse_unclean
from repair.hub import access, card, client, publish, stream
from repair.hub.source import RemoteSource, fetch_tensors, localize, open_remote, open_source, remote_of, resolve, work_folder
from repair.hub.spec import hub_spec, repo_id
from repair.planning.model import Plan, ShardOp
from repair.planning.recipe import Recipe
from repair.planning.target_check import load_doubts
from repair.io.atomic import json_text, write_json
from repair.io.output import PUBLISHED
from repair import api
from repair.doctor.side_by_side import verdicts_text
from repair.planning.build import make_plan
from repair.planning.text import plan_as_json, plan_as_text
from repair.targets.profiles import specs_text

README = "README.md"


@dataclass(frozen=True)
class HubFix:
    src: str
    dst: str | None = None
    pr: bool = False
    private: bool = False
    dry_run: bool = False
    recipe: Recipe = Recipe()
    original: str | None = None
    force: bool = False
    workdir: Path | None = None
    quiet: bool = False
    jobs: int | None = None  # tensors computed at once (None: one per core)


def hub_fix(o: HubFix, say: Callable[[str], None] = lambda line: None) -> dict:
    """Run the whole flow; returns a JSON-ready summary. Raises the tool's errors (one line each)."""
    spec = hub_spec(o.src)
    if spec is None:
        raise UsageError(f"{o.src}: a local folder; `hub fix` repairs Hub repos (owner/name[@rev]), use `ckpt-repair fix` here")
    dst = repo_id(o.dst, "--to") if o.dst else None
    if not dst and not o.pr:
        raise UsageError("hub fix: give --to DST (a fork to create or update) and/or --pr (a pull request on SRC)")
    if dst == spec.repo:
        raise UsageError(f"--to {dst}: that is SRC itself; use --pr to propose the fix to it")
    client.quiet_progress(o.quiet)
    work = work_folder(o.workdir, tuple(Path(p) for p in (o.original,) if p and Path(p).exists()))
    try:
        return _run(o, spec, dst, work, say)
    except RepairError as err:  # name files as owner/name@sha, not by their place in the work folder
        err.args = (_relabel(str(err), work),)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(o: HubFix, spec, dst: str | None, work: Path, say) -> dict:
    repo = resolve(spec)
    say(f"source: {spec} -> commit {repo.sha}")
    fork = publish.look(dst, repo, work) if dst else None  # all checks before a shard byte is read
    say(f"token: may {access.check(dst, bool(fork and fork.exists), repo.repo if o.pr else None)}")
    ckpt = open_remote(repo, work / "src", scales=True)
    source = remote_of(ckpt)
    original = open_source(o.original, work=work / "orig") if o.original else None
    plan = api.plan(ckpt, o.recipe, original=original)
    summary = {"source": {"repo": repo.repo, "revision": spec.revision, "sha": repo.sha}, "original": _label(original),
               "plan": _plan_json(plan)}
    if plan.is_noop:
        say("\n".join([f"{repo.label}: nothing to repair; it is already fixed. Nothing uploaded.", *load_doubts(plan.before)]))
        return {"status": "noop", **summary}
    options = recipe_options(plan)
    fid = card.fix_id(repo.label, plan.recipe.as_dict(), summary["original"])
    title = f"ckpt-repair: {_summary(plan)} ({fid})"
    summary.update(fix_id=fid, title=title, changed=[s.name for s in plan.shards if s.op == ShardOp.REWRITE])
    existing_pr = publish.find_open_pr(repo.repo, title) if o.pr else None
    fork_done = fork is not None and publish.already_fixed(fork, repo.label, plan.recipe.as_dict(), options, plan.removed_files)
    _say_state(say, plan, repo, dst, fork, fork_done, o.pr, existing_pr, title)
    summary.update(pr={"url": existing_pr, "existing": True} if existing_pr else None,
                   fork={"repo": dst, "head": fork.head, "already_fixed": True} if fork_done else None)
    want_fork, want_pr = bool(dst) and not fork_done, o.pr and not existing_pr
    if o.dry_run or not (want_fork or want_pr):
        return {"status": "dry-run" if o.dry_run else "up-to-date", **summary}
    return _publish(o, plan, source, fork if want_fork else None, want_pr, options, fid, title, work, say, summary)


def _publish(o, plan: Plan, source: RemoteSource, fork, want_pr: bool, options, fid, title, work, say, summary) -> dict:
    repo = source.repo
    plan = _with_original(plan, source)
    sections = input_sections(plan, o.force, jobs=o.jobs or default_jobs())  # doctor before, and the same verification of --original `fix` runs
    targets, before = sections.targets, tuple(r.before for r in sections.doctor)
    stream.link_unchanged(plan, source, work)
    streamed = stream.rewrite(plan, source, work, say, o.jobs or default_jobs())
    hashes = _hashes(plan, source, work, streamed)
    after = diagnose_each(stream.after_checkpoint(plan, source, work, f"{repo.label} (repaired)"), targets)
    sections = sections.with_after(after)
    _refuse_unclean(plan, sections, work, repo.label)
    facts = _facts(plan, repo, fid, targets, before, after, summary)
    text = card.section(facts)
    readme = _fork_readme(source, work, fork.repo, text, plan) if fork is not None else None
    check_inputs(plan)  # every input read is still the file verified and planned from: else exit 2, nothing made
    if fork is not None:  # only now, after every check of the output: a refusal never leaves a new fork behind
        fork = publish.create(fork, repo, work, private=o.private, say=say)
        say(f"fork: {fork.repo} ({fork.created or 'exists'}; head {fork.head})")
    stream.upload(streamed, work, ([("fork", fork.repo)] if fork else []) + ([("pr", repo.repo)] if want_pr else []), say)
    json_ops = lambda: _json_ops(plan, work)  # noqa: E731 - fresh operation objects per commit
    result = {**summary, "status": "done", "downloaded": streamed.downloaded, "peak_work_bytes": streamed.peak_bytes,
              "doctor_after": _after(sections)}
    if fork is not None:
        fork_hashes = {**hashes, README: {"source": hashes.get(README, {}).get("source"), "output": _sha(readme)}}
        report = _report(plan, fork_hashes, options, sections)
        ops = streamed.ops["fork"] + json_ops() + [_add(REPORT_NAME, report), _add(README, readme)]
        written = {op.path_in_repo for op in ops}
        copies, deletes, uploads = publish.reconcile(fork, repo, written, set(plan.removed_files))
        ops += copies + deletes + stream.upload_unchanged(source, uploads, work, fork.repo, streamed, say)
        check_inputs(plan)
        info = publish.commit(fork.repo, ops, title=title, description=card.pr_description(text), parent=fork.head, pr=False)
        PUBLISHED.append(f"{fork.repo}@{info.oid}")  # an interrupt from here on must not say nothing was written
        say(f"committed {len(ops)} change(s) to {fork.repo} in one commit: {info.commit_url}")
        result["fork"] = {"repo": fork.repo, "created": fork.created, "parent": fork.head, "commit": info.oid,
                          "url": info.commit_url, "copied_server_side": len(copies), "uploaded_unchanged": uploads}
    if want_pr:
        ops = streamed.ops["pr"] + json_ops() + [_add(REPORT_NAME, _report(plan, hashes, options, sections))]
        ops += [_delete(n) for n in plan.removed_files]
        check_inputs(plan)
        info = publish.commit(repo.repo, ops, title=title, description=card.pr_description(text), parent=repo.sha, pr=True)
        say(f"pull request: {info.pr_url}")
        result["pr"] = {"url": info.pr_url, "existing": False, "parent": repo.sha, "commit": info.oid}
    return result


def _refuse_unclean(plan: Plan, sections: Sections, work: Path, label: str) -> None:
    """`fix`'s check of its output against doctor --strict for --target, before any fork is created or anything
    is uploaded or committed."""
    try:
        for record in sections.doctor:
            refuse_unclean(plan, record, work, f"{label} (repaired)")
    except RepairError as err:
        err.args = (str(err).replace("nothing was written", "nothing was committed"),)
        raise


def _with_original(plan: Plan, source: RemoteSource) -> Plan:
    """With --original: a full local copy of a Hub original, and the source's packed tensors fetched by
    range (what verifying the original reads)."""
    if plan.original is None:
        return plan
    plan = make_plan(plan.source, plan.recipe, localize(plan.original), plan.before)
    packed = {n for m in plan.format.group_modules(plan.source.infos()) if m.is_quantized for n in m.tensors}
    fetch_tensors(source, plan.source, lambda t: t.name in packed)
    return plan


def _hashes(plan: Plan, source: RemoteSource, work: Path, streamed: stream.Streamed) -> dict:
    """{file: {source, output}} for every output file, as execute() records them."""
    hashes = dict(streamed.hashes)
    for step in plan.shards:
        if step.op == ShardOp.COPY_FILE:
            digest = _digest(plan, source, step.name, work)
            hashes[step.name] = {"source": digest, "output": digest}
    for name in plan.copied_files:
        digest = _digest(plan, source, name, work)
        hashes[name] = {"source": digest, "output": digest}
    for name, content in plan.json_files.items():
        old = plan.source.pins.get(source.folder / name)  # the bytes planned from, as verified
        hashes[name] = {"source": _sha(stream.pinned_bytes(old)) if old else None, "output": _json_digest(work, name, content)}
    return hashes


def _digest(plan: Plan, source: RemoteSource, name: str, work: Path) -> str:
    remote = source.repo.files[name]
    return remote.sha256 if remote.is_lfs else _sha(stream.small_file(source, name, work, plan.source.pins))


def _json_digest(work: Path, name: str, content: dict) -> str:
    path = work / "out" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json(path, content)


def _json_ops(plan: Plan, work: Path) -> list:
    return [_add(name, (work / "out" / name).read_bytes()) for name in plan.json_files]


def _report(plan: Plan, hashes: dict, options: dict, sections: Sections) -> bytes:
    """repair_report.json exactly as `fix` writes it."""
    return json_text(build_report(plan, hashes, options, sections)).encode("utf-8")


def _after(sections: Sections) -> dict:
    """doctor on the output as the result shows it: one target's verdict as always; several: {"targets": [each]}."""
    verdicts = [r.as_dict()["after"] for r in sections.doctor]
    return verdicts[0] if len(verdicts) == 1 else {"targets": verdicts}


def _facts(plan: Plan, repo, fid: str, targets, before, after, summary) -> card.RepairFacts:
    return card.RepairFacts(
        source_repo=repo.repo, source_sha=repo.sha, asked=summary["source"]["revision"], endpoint=client.endpoint(),
        recipe=plan.recipe.as_dict(), fix_id=fid, target=specs_text(targets), before=verdicts_text(before, strict=True),
        after=verdicts_text(after, strict=True), changes="\n".join(plan_as_text(plan).splitlines()[1:]),
        rewritten=tuple([s.name for s in plan.shards if s.op == ShardOp.REWRITE] + list(plan.json_files)),
        removed=tuple(plan.removed_files), original=summary["original"])


def _fork_readme(source: RemoteSource, work: Path, dst: str, text: str, plan: Plan) -> bytes:
    old = stream.small_file(source, README, work, plan.source.pins).decode("utf-8", "replace") if README in source.repo.files else None
    quantized = not plan.recipe.drop_quantization
    return card.fork_card(old, source_repo=source.repo.repo, title=dst, text=text, quantized=quantized).encode("utf-8")


def _summary(plan: Plan) -> str:
    """A short, deterministic description of the fix for titles: actions and the modules they touch."""
    by_action: dict[str, list[str]] = {}
    for c in plan.changes:
        by_action.setdefault(c.action, []).append(c.module)
    parts = [f"{a} {', '.join(m[:3])}{f' (+{len(m) - 3} more)' if len(m) > 3 else ''}" for a, m in by_action.items()]
    if plan.recipe.drop_quantization:
        parts.append("drop the quantization config")
    if plan.exclusions_added and not parts:
        parts.append(f"exclude {', '.join(plan.exclusions_added[:3])}")
    return "; ".join(parts) or "fix the config files"


def _say_state(say, plan, repo, dst, fork, fork_done, pr, existing_pr, title) -> None:
    say("\n".join([plan_as_text(plan), *load_doubts(plan.before)]))
    changed = [s.name for s in plan.shards if s.op == ShardOp.REWRITE]
    say(f"changed shards (the only shards downloaded): {', '.join(changed) or 'none'}; "
        f"{sum(1 for s in plan.shards if s.op == ShardOp.COPY_FILE)} unchanged shard(s) stay on the Hub")
    if dst:
        state = "already has this fix; nothing to do" if fork_done else (
            f"exists (head {fork.head}); the fix is committed on top" if fork.exists else f"will be a server-side duplicate of {repo.repo}")
        say(f"fork {dst}: {state}")
    if pr:
        say(f"pull request on {repo.repo}: " + (f"an open PR with this fix already exists: {existing_pr}; not opening another"
                                                 if existing_pr else f"'{title}' (based on {repo.sha})"))


def _relabel(text: str, work: Path) -> str:
    mirror = re.escape(str(work)) + r"/(?:src|orig)/([^/\s]+?)--([^/\s]+)/([0-9a-f]{40})"
    return re.sub(mirror, r"\1/\2@\3", text)


def _plan_json(plan: Plan) -> dict:
    return plan_as_json(plan)


def _label(ckpt) -> str | None:
    if ckpt is None:
        return None
    remote = remote_of(ckpt)
    return remote.repo.label if remote else str(ckpt.root)


def _add(name: str, data: bytes):
    from huggingface_hub import CommitOperationAdd

    return CommitOperationAdd(name, data)


def _delete(name: str):
    from huggingface_hub import CommitOperationDelete

    return CommitOperationDelete(name)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
