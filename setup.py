"""Build of the optional compiled hot path (probe.engine.accel._accel); everything else is
pyproject.toml.

The extension is optional: without a C compiler or the Python headers, ``pip install``
still succeeds and the probe runs its pure-Python path (probe/engine/accel/__init__.py says which).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "probe.engine.accel._accel",
            ["probe/engine/accel/_accel.c"],
            depends=[
                # generated from probe/records.py: python -m probe.engine.gen_header
                "probe/engine/accel/_accel_gen.h",
                "probe/engine/accel/_accel_ring.h",
                "probe/engine/accel/_accel_wrap.h",
                "probe/engine/accel/_accel_build.h",
                "probe/engine/accel/_accel_phase.h",
                "probe/engine/accel/_accel_fwd.h",
            ],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
        )
    ]
)
