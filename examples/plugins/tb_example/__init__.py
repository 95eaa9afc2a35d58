"""The two registry entries this package adds (import-light: no torch here).

``SCHEME``/``WORKLOAD`` are what the entry points (pyproject.toml) and the dotted
names (``tb_example:SCHEME``) point at: the parameter dataclass, validated with
the rest of the spec before anything starts, and the implementation, imported
only inside the trial's processes.
"""

from testbed.training.registry import Entry

from .params import LinRegParams, LocalSgdParams

SCHEME = Entry("localsgd", LocalSgdParams, "tb_example.localsgd:run",
               "local SGD: every worker steps on its own, models averaged every H steps (ring all-reduce)")
WORKLOAD = Entry("linreg", LinRegParams, "tb_example.linreg:LinRegWorkload",
                 "linear regression on seeded synthetic data; held-out mean squared error")
