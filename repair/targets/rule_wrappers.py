"""Exclusion rules wrapped around a release's own matcher where the model code decides instead of the list: an MTP
draft's layers built BF16, an MTP layer excluded whole by its own name, and a list the runtime never reads.
runtime_rules.RuntimeRules.bind puts them around the matcher; each answers the same questions as the rule inside."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftBf16:
    """A rule whose answers for an MTP draft's layers are "built BF16" (the draft's model code drops the config)."""

    inner: object
    prefixes: tuple[str, ...]
    plain: frozenset[str] = frozenset()  # layers the model builds as a plain nn.Linear (llama_eagle3.py's fc)

    def _plain(self, prefix: str) -> bool:
        return prefix.startswith(self.prefixes) or prefix.removeprefix("model.") in self.plain

    def excludes(self, prefix: str) -> bool:
        return self._plain(prefix) or self.inner.excludes(prefix)

    def shard_excluded(self, prefix: str) -> bool:
        return self._plain(prefix) or self.inner.shard_excluded(prefix)

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        return None if self._plain(fused) else self.inner.fused_refusal(fused, shards)

    def names(self, prefix: str) -> bool:
        return self.inner.names(prefix)


@dataclass(frozen=True)
class MtpLayers:
    """A rule under which an MTP layer built from the model's config (`draft.mtp_layer`) is unquantized, everything
    under it, when the list excludes the layer's own name (TensorRT-LLM's _get_decoder_layer_quant_config)."""

    inner: object
    excluded: tuple[str, ...]  # the MTP layers whose own name the list excludes

    def _whole(self, prefix: str) -> bool:
        return any(prefix.startswith(layer + ".") for layer in self.excluded)

    def excludes(self, prefix: str) -> bool:
        return self._whole(prefix) or self.inner.excludes(prefix)

    def shard_excluded(self, prefix: str) -> bool:
        return self._whole(prefix) or self.inner.shard_excluded(prefix)

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        return None if self._whole(fused) else self.inner.fused_refusal(fused, shards)

    @property
    def exclusions(self):
        return self.inner.exclusions


@dataclass(frozen=True)
class UnreadList:
    """A list the runtime never reads (config.json's nested ModelOpt block): every layer is built as with the list it
    does read (the block's top level, often none); `names` still answers for the list as written, so its entries are
    not called unused (they name modules)."""

    built: object  # the rule over the list the runtime reads instead
    listed: object  # the rule over the entries as written

    def excludes(self, prefix: str) -> bool:
        return self.built.excludes(prefix)

    def shard_excluded(self, prefix: str) -> bool:
        return self.built.shard_excluded(prefix)

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        return self.built.fused_refusal(fused, shards)

    def names(self, prefix: str) -> bool:
        return self.listed.names(prefix)
