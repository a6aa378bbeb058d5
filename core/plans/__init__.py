"""Plans: the YAML file a campaign is written in (``plans/*.yaml``).

``plan`` the typed model (items, hosts, statuses), ``planfile`` reading and validating a file as
a whole (file:line for every problem), ``params`` typed action parameters, ``shellvars``
``${var}`` in shell text (values travel in the environment), ``adopt_spec`` what an item's
``adopt:`` names, ``arms`` a campaign's arms (template items expanded once per arm), ``todos``
todowrite interop. May import the leaves and ``core.ml``'s pure
formats; ``planfile`` alone reads ``core.actions.registry`` (a plan is checked against the kinds).
"""
