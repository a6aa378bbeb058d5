"""Engines: what a serving engine does with a drafter. ``rules`` one rule table per engine (what it
reads from config.json), ``lint`` specdeck's reading against each engine's (``specdeck
engines``), ``served`` specdeck's drafter run under an engine's rule, ``llama`` the llama.cpp leg
of an eval (llama-server), ``greedy`` extract's continuations from a plain llama-server and
their exactness checks, ``gguf_convert`` llama.cpp's converter. Imports ``models``,
``measure`` and ``formats``; the tasks import it.
"""
