"""Runtime profiles as data: how each runtime release treats a drafter checkpoint.

Adding a runtime or a release is adding a row here, not a code path. Facts (see
docs/ARCHITECTURE.md and the research notes): vLLM 0.21-0.24 build every drafter linear in
BF16 and silently skip tensor names they do not know; from 0.25.0 (commit 7a90eb98a) every
drafter layer follows the draft checkpoint's own quantization config and unknown names raise.
How a family's layers are built (layer kinds, TP plans) is the architecture's knowledge, in repair/arch/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from repair import arch
from repair.arch.profiled import ReleaseProfile
from repair.arch.registry import Builds, Registry, Resolved, resolve as resolve_listed
from repair.errors import BadInput, UsageError
from repair.targets.entry_mappers import bind_mappers
from repair.targets.fused_exclusions import bind_fused
from repair.targets.runtime_rules import CONFIG_KINDS, RuntimeRules, shipped_rules


@dataclass(frozen=True)
class Profile:
    """One runtime release range and how it treats a drafter checkpoint."""

    name: str
    runtime: str  # "vllm" or "bf16"
    min_version: tuple[int, ...] | None  # inclusive
    max_version: tuple[int, ...] | None  # exclusive
    follows_draft_config: bool  # False: every linear is built BF16 whatever the config says
    unknown_tensors: str  # "skip" (silently dropped), "raise", or "log_skip" (logged, and loading goes on)
    allows_quant_config: bool = True
    simulates_loads: bool = False  # doctor runs this runtime's loader simulation (repair/targets/vllm_loader.py) and degree rules
    knows_layer_roles: bool = False  # the generated layer roles are this runtime's own (a quantized role is an error)
    refused: Mapping[str, str] = field(default_factory=dict)  # quant_algo -> the error reading the config gives
    rules: RuntimeRules | None = None  # a data-file release's own matchers and behaviours (None: the format's, vLLM's)
    speaker: str = "vLLM"  # how messages name the runtime


# vLLM 0.32 modelopt.py: ModelOptQuantConfigBase.from_config refuses a quant_algo outside QUANT_ALGOS
VLLM_REFUSED = MappingProxyType({
    "NVFP4_AWQ": "ValueError: ModelOpt currently only supports: ['FP8', 'FP8_PER_CHANNEL_PER_TOKEN', 'FP8_PB_WO', "
                 "'NVFP4', 'W4A16_NVFP4', 'MXFP8', 'MIXED_PRECISION'] quantizations in vLLM. Please check the "
                 "`hf_quant_config.json` file for your model's quant configuration."})
PROFILES: tuple[Profile, ...] = (
    Profile("vllm 0.21-0.24", "vllm", (0, 21, 0), (0, 25, 0), follows_draft_config=False, unknown_tensors="skip",
            simulates_loads=True, knows_layer_roles=True),
    Profile("vllm >= 0.25", "vllm", (0, 25, 0), None, follows_draft_config=True, unknown_tensors="raise",
            simulates_loads=True, knows_layer_roles=True, refused=VLLM_REFUSED),
)
BF16 = Profile("bf16", "bf16", None, None, follows_draft_config=False, unknown_tensors="raise", allows_quant_config=False)


def rules_profiles(rules: tuple[RuntimeRules, ...]) -> tuple[Profile, ...]:
    """One profile per shipped rules file, valid from its release up to the next one's of the same runtime."""
    out = []
    for r in rules:
        later = [n.release for n in rules if n.runtime == r.runtime and n.release > r.release]
        out.append(Profile(r.label, r.runtime, r.release, min(later) if later else None, r.follows_draft_config,
                           r.unknown_tensors["policy"], refused=MappingProxyType(dict(r.refused_algorithms)), rules=r,
                           speaker=r.speaker))
    return tuple(out)


DATA_PROFILES = rules_profiles(shipped_rules())
NEWEST_KNOWN = "vllm==0.32.0"


@dataclass(frozen=True)
class Target:
    """A resolved `--target`: the spelling the user gave and the profile that applies."""

    spec: str
    profile: Profile
    release: ReleaseProfile | None = None  # the generated profile whose rows apply (newest shipped release <= the target's)
    version: tuple[int, ...] | None = None  # the release the user asked for

    @property
    def registry(self) -> Registry | None:
        """The target release's own model registry: its rules file's, else its generated profile's where that is this
        runtime's (another runtime's rules borrow vLLM's rows, never its registry); None where none is recorded."""
        rules = self.profile.rules
        if rules is not None:
            return rules.model_registry
        older = self.version is not None and self.release is not None and self.release.release > self.version
        return self.release.registry if self.release is not None and not older else None  # an older release's may differ

    def built(self, config: dict | None | Builds) -> Resolved:
        """Which of config.json's `architectures` this target builds (arch/registry.py), by its release's registry: the
        one decision every reader of the name obeys (doctor decides it once, from `read_builds`, and passes it along).
        A vLLM release older than every profile: the class its layer rows' release builds, without that release's
        verdict (a name it refuses may be one the older release registered)."""
        found = config.of if isinstance(config, Builds) else lambda registry: resolve_listed(config, registry)
        own = found(self.registry)
        if self.registry is None and self.profile.rules is None and self.release is not None:
            return Resolved(found(self.release.registry).name or own.name)
        return own

    def bind(self, declaration, family, config: dict | None, built: Resolved | None = None):
        """The declaration as this target reads it: a rules-file release's own matchers, else unchanged (vLLM's);
        `built`: what it builds (Target.built), when decided."""
        rules = self.profile.rules
        name = (built or self.built(config)).name or ""
        if declaration.format.NEEDS_LAYER_ROWS and self.release is not None and name not in self.release.entries:
            raise BadInput(f"{self.release.label}'s generated profile does not cover {name or 'this architecture'}, and a "
                           f"{declaration.format.NAME} checkpoint's schemes are per layer of the class it builds, so doctor "
                           "cannot judge it for this target; judge it with a release whose profile covers it (vllm==0.32.0)")
        if rules is None and self.profile.allows_quant_config and self.release is not None:
            # vLLM's own reading: the format's rule, a fused layer asked as the release's data says
            # (a form the data records no fused tests for, DeepSeek-V4's fp8, keeps its format's own rule), the list
            # rewritten first with the mappers the class hands its quant config (targets/entry_mappers.py)
            kind = CONFIG_KINDS.get(declaration.format.NAME)
            fused = bind_fused(declaration, family, self.release.fused_exclusions.get(kind) if kind else None)
            return bind_mappers(fused, family, self.release.entries.get(name, {}).get("exclusion_mappers"),
                                self.release.modelopt_mixed_keys)
        if rules is None or not declaration.quantized:
            return declaration
        kind = CONFIG_KINDS.get(declaration.format.NAME)
        if kind not in rules.matchers:  # name the shipped releases of this runtime whose files describe the form
            raise BadInput(rules.undescribed(declaration, tuple(
                f"{p.rules.runtime}=={'.'.join(map(str, p.rules.release))}" for p in DATA_PROFILES
                if p.rules.runtime == rules.runtime and kind in p.rules.matchers)))
        return rules.bind(declaration, rules.building(name, family.fused_layers, config), config)

    @property
    def wants_all_bf16(self) -> bool:
        return not self.profile.follows_draft_config

    @property
    def label(self) -> str:
        """The profile in words, naming the generated release profile used (messages say which one applies)."""
        if not self.profile.allows_quant_config:
            return self.profile.name
        if self.profile.rules is not None:
            used = self.profile.rules
            asked = "" if self.version == used.release else f" (the newest shipped at or below {'.'.join(map(str, self.version or ()))})"
            rows = f"; layer rows from the {self.release.label} profile" if self.release else ""
            return f"{used.label} rules from {used.source}{asked}{rows}"
        if self.release is None:
            return f"{self.profile.name}; no generated layer profile ships"
        older = self.version is not None and self.release.release > self.version
        return f"{self.profile.name}; layer rows from the {self.release.label} profile" + (
            " (none ships at or below this release: the oldest one)" if older else "")


def read_builds(config: dict | None) -> Builds:
    """config.json's `architectures` as every shipped release reads it (each generated profile's registry, each rules
    file's), each list read once: what doctor passes along to every question of which class a release builds."""
    registries = [p.registry for p in arch.PROFILES] + [p.rules.model_registry for p in DATA_PROFILES]
    return Builds.read(config, [r for r in registries if r is not None])


def release_at_or_below(runtime: str, version: tuple[int, ...]) -> ReleaseProfile | None:
    """The newest shipped generated profile of `runtime` whose release is at or below `version`; the oldest shipped
    one when none is (its label says so), None when the runtime has none."""
    shipped = [p for p in arch.PROFILES if p.runtime == runtime]
    found = [p for p in shipped if p.release <= version]
    return found[-1] if found else (shipped[0] if shipped else None)


def resolve(spec: str | None) -> Target:
    """`vllm==X.Y.Z` (any release; newest known by default), `<runtime>==X.Y.Z` for a runtime with shipped rules
    files (the newest at or below X, named in the label), or `bf16`."""
    spec = (spec or NEWEST_KNOWN).strip()
    if spec.lower() == "bf16":
        return Target("bf16", BF16)
    if re.search(r"[,;]", spec):  # `a,b` must not check `a` alone and call the result healthy (resolve_many splits them)
        raise UsageError(f"--target {spec[:200]!r}: separate several targets with single commas, e.g. vllm==0.32.0,bf16")
    # a release suffix as pip spells it (rc1, .post1, +cu128)
    # ASCII only (re.ASCII): a typed spec is recorded verbatim (report, PR title), and `\d` would take Arabic-Indic digits
    match = re.fullmatch(r"([a-z][a-z0-9_-]{0,30})\s*==\s*(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?[\w.+!-]*", spec, re.IGNORECASE | re.ASCII)
    if match:  # pip's names are case-insensitive (VLLM==0.32.0 is vllm's): printed and recorded the canonical way
        spec = f"{match.group(1).lower()}=={spec[match.start(2):]}"  # no spaces around == either
        match = re.fullmatch(match.re, spec)
    runtimes = sorted({p.runtime for p in DATA_PROFILES})
    if not match or (match.group(1) != "vllm" and match.group(1) not in runtimes):
        known = " or ".join(f"{r}==X.Y.Z" for r in ["vllm", *runtimes])
        raise UsageError(f"--target {spec[:200]!r}: expected {known}, or bf16")
    version = tuple(int(p or 0) for p in match.groups()[1:])
    if match.group(1) != "vllm":
        return _data_target(spec, match.group(1), version)
    for profile in PROFILES:
        if (profile.min_version is None or version >= profile.min_version) and (
            profile.max_version is None or version < profile.max_version
        ):
            return Target(spec, profile, release_at_or_below(profile.runtime, version), version)
    raise UsageError(f"--target {spec}: vLLM before 0.21.0 cannot load Gemma 4 assistants at all; target 0.21.0 or newer")


def _data_target(spec: str, runtime: str, version: tuple[int, ...]) -> Target:
    """The newest shipped release file of `runtime` at or below `version`; its layer rows from the profile it names."""
    found = [p for p in DATA_PROFILES if p.runtime == runtime and p.min_version <= version]
    if not found:
        oldest = min(p.min_version for p in DATA_PROFILES if p.runtime == runtime)
        raise UsageError(f"--target {spec}: the oldest {runtime} rules shipped are {'.'.join(map(str, oldest))}'s "
                         "(older releases read exclusions another way); target that release or a newer one")
    profile = found[-1]
    rows = re.fullmatch(r"(\w+)==(\d+)\.(\d+)\.?(\d*)", profile.rules.layer_rows)
    return Target(spec, profile, release_at_or_below(rows.group(1), tuple(int(p or 0) for p in rows.groups()[1:])), version)


def shipped_targets() -> tuple[Target, ...]:
    """One target per release whose own reading ships: each generated vLLM profile's, each rules file's (what doctor
    asks before calling an exclusion entry one that matches no module: doctor/unused_entries.py)."""
    specs = [f"{p.runtime}=={'.'.join(map(str, p.release))}" for p in arch.PROFILES]
    specs += [f"{p.runtime}=={'.'.join(map(str, p.min_version))}" for p in DATA_PROFILES]
    return tuple(resolve(s) for s in specs)


MAX_TARGETS = 16  # `--target a,b,...`: each is a diagnosis (and a derived recipe) of its own


def resolve_many(spec: str | None) -> tuple[Target, ...]:
    """`--target a,b,c`: each part as `resolve` reads it, in the order given; a release named twice (`vllm==0.32`,
    `vllm==0.32.0`) counts once. `bf16` may be one of them: the output must then also be a plain BF16 checkpoint,
    which every runtime loads (so `fix` dequantizes everything, and the runtimes are checked on that)."""
    text = spec or NEWEST_KNOWN
    parts, shown = text.split(","), repr(text if len(text) <= 200 else text[:200] + "...")
    found: dict[tuple, Target] = {}
    for i, part in enumerate(parts, 1):
        if len(parts) > 1 and not part.strip():
            raise UsageError(f"--target {shown}: part {i} is empty; separate targets with single commas, e.g. vllm==0.32.0,bf16")
        try:
            target = resolve(part)
        except UsageError as err:
            raise UsageError(f"{err} (part {i} of --target {shown})" if len(parts) > 1 else str(err)) from None
        found.setdefault((target.profile.name, target.version), target)
        if len(found) > MAX_TARGETS:
            raise UsageError(f"--target {shown}: more than {MAX_TARGETS} different targets; each is a whole diagnosis, "
                             "so name the releases you serve with")
    return tuple(found.values())


def specs_text(targets: tuple[Target, ...]) -> str:
    """The targets as one `--target` value (what a report records and a command line repeats)."""
    return ",".join(t.spec for t in targets)


def target_choices() -> tuple[str, ...]:
    """Every target a chooser should offer, newest first: the newest known vLLM release, the first
    release of each older profile, each shipped release file of the other runtimes, then bf16 (the web
    page asks this; it never lists releases itself)."""
    firsts = sorted((p.min_version for p in PROFILES if p.min_version), reverse=True)
    releases = [NEWEST_KNOWN] + [f"vllm=={'.'.join(map(str, v))}" for v in firsts]
    shipped = sorted(DATA_PROFILES, key=lambda p: (p.runtime, tuple(-v for v in p.min_version)))
    releases += [f"{p.runtime}=={'.'.join(map(str, p.min_version))}" for p in shipped]
    return tuple(dict.fromkeys(releases)) + (BF16.name,)
