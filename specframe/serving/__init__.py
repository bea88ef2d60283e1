"""Serving: arms in serving engines' vocabularies, and the acceptance that export uses.

:mod:`~specframe.serving.engines` exports an arm to vLLM, SGLang, transformers and llama.cpp
and imports their configurations as arms, each with a fidelity statement;
:mod:`~specframe.serving.acceptance` measures acceptance by depth and rank from recorded steps
and fits the static tree an engine can run (docs/serving.md). Both import only the core, so the
experiment file's ``engine = ...`` arms read through them.

:mod:`specframe.commands` (above replay) holds the ``specframe acceptance`` and ``specframe
export`` commands and the acceptance probe over a trace, which need the experiment harness and
replay: this folder is one layer, below the harness.
"""
