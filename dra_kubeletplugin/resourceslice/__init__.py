"""ResourceSlice publishing of the pools a driver describes (the Go helper's ``resourceslice`` package).

* ``pools.py`` — :class:`~dra_kubeletplugin.resourceslice.pools.Pool` and
  :class:`~dra_kubeletplugin.resourceslice.pools.DriverResources`, the API's per-slice limits,
  the split of devices and counter sets into slices, pre-validation (pure).
* ``sync.py`` — the plan: what to delete, update and create to make the API match (pure).
* ``controller.py`` — :class:`~dra_kubeletplugin.resourceslice.controller.SliceController`: lists,
  applies the plan, watches its slices, retries.
"""
