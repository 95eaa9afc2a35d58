"""What a run leaves behind: span recorder, samplers, record readers, trace merge.

Submodules are imported explicitly (``testbed.collect.samplers`` needs
pyroute2/psutil, ``testbed.collect.trace`` only the standard library), so
importing this package pulls in nothing heavy.
"""
