"""Import root for the device engine (kernels/), the f64 reference (reference/) and the gates (gates/).

The folders keep their design-card names at the top of the repo; setuptools maps them here so that
their import names (bloomery_gates.kernels, ...) cannot collide with PyPI packages such as `kernels`.
"""
