"""Hugging Face Hub sources and publishing: `owner/name[@rev]` wherever a checkpoint folder is accepted,
and `hub fix` (fork-and-fix / pull request) without downloading the whole model.

Modules: spec (what a SRC string names, remote file names), client (huggingface_hub access, endpoint,
cache), errors (huggingface_hub errors -> the tool's one-line errors, token scrubbing), source (a remote
checkpoint from headers and byte ranges), card (the model card), publish (fork, uploads, one commit, PRs),
workflow (`hub fix` end to end). huggingface_hub is imported only when a Hub repo is used.
"""
