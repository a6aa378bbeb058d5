"""Decoding: speculative decoding with the models. ``generate`` online chain and DDTree,
``ddtree`` the draft trees, ``offline`` tau from cached target features. Imports ``models``,
``measure`` (how a round is counted) and ``formats``.
"""
