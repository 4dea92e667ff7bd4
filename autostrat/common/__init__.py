"""MindSpore's ``mindspore.common`` path: `initializer` and the dtypes (thin faces)."""
