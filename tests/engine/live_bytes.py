"""Every tensor storage ops make, tracked while they live: a computation's peak of transient bytes on any device
(the CPU's allocator has no peak counter). Shared by the memory tests of the plan's workspace terms."""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """The bytes of every storage an op creates under the mode, freed when its storage dies: the peak."""

    def __init__(self, given: list[torch.Tensor] = ()):
        super().__init__()
        self.sizes = {x.untyped_storage().data_ptr(): 0 for x in given}  # the inputs are not the computation's
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a view's (or an in-place op's) storage is its input's: not new, whether or not the mode saw it made
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if (isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.sizes
                    and t.untyped_storage().data_ptr() not in inputs):
                st = t.untyped_storage()
                self.sizes[st.data_ptr()] = st.nbytes()
                self.now += st.nbytes()
                self.peak = max(self.peak, self.now)
                weakref.finalize(st, self._free, st.data_ptr())
        return out

    def _free(self, ptr: int) -> None:
        self.now -= self.sizes.pop(ptr)
