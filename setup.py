"""Build of the optional compiled hot path (probe._accel); everything else is pyproject.toml.

The extension is optional: without a C compiler or the Python headers, ``pip install``
still succeeds and the probe runs its pure-Python path (probe/accel.py says which).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "probe._accel",
            ["probe/_accel.c"],
            depends=[
                "probe/_accel_gen.h",  # generated from probe/records.py: python -m probe.gen_header
                "probe/_accel_ring.h",
                "probe/_accel_wrap.h",
                "probe/_accel_build.h",
                "probe/_accel_phase.h",
                "probe/_accel_fwd.h",
            ],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
        )
    ]
)
