"""What is traced: processes, cgroups, files and mounts, and each file's identity.

:mod:`.selection` turns the selectors (``--pid``, ``--children``, ``--cgroup``, ``--file``)
into a :class:`~.selection.Selection`; :mod:`.process` checks a pid; :mod:`.identity` names a
file by (device, inode).  ``bpf.targets`` writes a selection into the kernel's maps.
"""
