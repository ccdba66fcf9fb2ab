#!/usr/bin/env python3
"""nvidia_wheels.py - NVIDIA's CUDA libraries installed as Python wheels, as cuda/meson.build
sees them: one line per folder site-packages/nvidia/<name> that has a lib/ folder,
"<name>\t<lib folder>\t<include folder or empty>", for the site-packages of the Python that
runs this script. A machine set up for PyTorch keeps cuDNN (nvidia/cudnn) and NCCL
(nvidia/nccl) there, and with CUDA 13 the rest in nvidia/cu13. Prints nothing when there
are none."""
import os
import site
import sys

roots = []
try:
    roots += site.getsitepackages()
except AttributeError:  # some virtualenvs
    pass
try:
    roots.append(site.getusersitepackages())
except AttributeError:
    pass
roots += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]

seen = set()
for root in roots:
    nv = os.path.join(root, "nvidia")
    if not os.path.isdir(nv):
        continue
    for name in sorted(os.listdir(nv)):
        lib = os.path.realpath(os.path.join(nv, name, "lib"))
        if name in seen or not os.path.isdir(lib):
            continue
        seen.add(name)
        inc = os.path.realpath(os.path.join(nv, name, "include"))
        print(f"{name}\t{lib}\t{inc if os.path.isdir(inc) else ''}")
