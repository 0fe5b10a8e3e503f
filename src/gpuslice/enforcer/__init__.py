"""The Python face of the native enforcer (``native/``): the files and the library through which the node
side and the enforcer in every slice process talk.

=============  ==============================================================================================
module         owns
=============  ==============================================================================================
``slicefile``  the slice file (``key=value``; writer, parser that follows the C parser rule for rule) and
               :func:`~gpuslice.enforcer.slicefile.slice_config`, the one builder of a slice file from a grant
``region``     the region ABI (one shared-memory file per slice): reader, and a creator for tests
``devstate``   each slice's record file (``<device_state_dir>/<stem>.slices/<grant>``, v5): reader, names
``slicerecords`` who makes and removes the record files (owner, mode; at grant, release, reconcile)
``policy``     the per-device policy roster (``<stem>.policy/<grant>``): root's, every pacer obeys it
``devfolders`` the per-device folders of both (moved aside when a tenant took the name first)
``library``    where ``libgpuslice.so`` is (env, the checkout's build, the wheel's copy)
=============  ==============================================================================================

The binary layouts belong to ``native/include/gpuslice/*.h``; the contracts are in ``native/README.md``.
"""
