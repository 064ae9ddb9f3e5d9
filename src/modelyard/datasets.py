"""Built-in data: scikit-learn's bundled digits, upscaled to MNIST's 28x28 uint8 layout.

No download is needed (the data ships inside scikit-learn), so the demo model,
training tests and conversion reports all run offline.
"""
from __future__ import annotations

import numpy as np

DIGITS_SHAPE = (28, 28)


def load_digits_28(split: str = "train", test_fraction: float = 0.2, seed: int = 0):
    """Return ``(images uint8 [n, 28, 28], labels int64 [n])`` for ``split`` in train/test/all.

    The 8x8 images (values 0..16) are scaled to 0..255 and upscaled by
    nearest-neighbour (x3, padded by 2 pixels) so requests look like MNIST's.
    The split is deterministic for a given seed.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = (digits.images * (255.0 / 16.0)).round().astype(np.uint8)  # [n, 8, 8]
    big = small.repeat(3, axis=1).repeat(3, axis=2)  # [n, 24, 24]
    images = np.zeros((len(big),) + DIGITS_SHAPE, dtype=np.uint8)
    images[:, 2:26, 2:26] = big
    labels = digits.target.astype(np.int64)
    if split == "all":
        return images, labels
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(len(images) * test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]
    if split == "train":
        return images[train_idx], labels[train_idx]
    if split == "test":
        return images[test_idx], labels[test_idx]
    raise ValueError(f"unknown split {split!r}: use 'train', 'test' or 'all'")
