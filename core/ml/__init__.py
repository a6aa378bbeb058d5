"""specdeck's ML core: the code that runs on the hosts as ``python -m core.ml.<task>``.

This folder's own modules are the commands a host runs, one thin entry each (its body is in a
wing): ``eval`` ``extract`` ``strip`` ``export`` ``watcher`` ``engine_clients`` (in ``tasks``),
``compare`` ``parity`` (in ``measure``), ``gguf_convert`` (in ``engines``), ``tiny``
``codemodel`` (in ``demo``), and the ``train`` package (``python -m core.ml.train``).

The wings, each importing only the ones before it:

* ``formats``   files and numbers at a task's edge (config, layouts, safetensors, result.json)
* ``measure``   how tau is counted and compared (pure Python)
* ``models``    the drafter, the target during decoding, masks, features, the sampling rule
* ``decoding``  speculative decoding with them: online chain/DDTree, offline from features
* ``engines``   what vLLM, SGLang and llama.cpp do with a drafter; the llama.cpp leg of an eval
* ``demo``      the demo's tiny models
* ``tasks``     the commands' bodies
* ``train``     the reference DFlash trainer

Importing this package is cheap: it loads neither torch nor transformers (``formats`` and
``measure`` never do; the rest is for the hosts). From the rest of ``core`` this package imports
only the leaf modules :mod:`core.errors`, :mod:`core.text` and :mod:`core.moved` (the standard
library only; they ship in the same wheel), so what runs on a host needs neither the store, the
runner nor asyncssh (tests/test_import_graph.py).
"""


def __getattr__(name: str):
    from core import moved

    return moved.refuse(__name__, name)
