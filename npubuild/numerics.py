"""Error measures used by every verification: LSB error, SNR, cosine similarity, top-1 agreement."""

from __future__ import annotations

import numpy as np

SNR_CAP_DB = 200.0  # identical signals: report a finite, recognisable ceiling


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    ref = np.asarray(reference, np.float64).ravel()
    err = ref - np.asarray(test, np.float64).ravel()
    noise = float(np.sum(err * err))
    signal = float(np.sum(ref * ref))
    if noise == 0.0:
        return SNR_CAP_DB
    if signal == 0.0:
        return -SNR_CAP_DB
    return float(min(SNR_CAP_DB, 10.0 * np.log10(signal / noise)))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float | None:
    """Fraction of samples whose argmax agrees, for (N, classes) outputs; None for other shapes."""
    if a.ndim != 2 or a.shape[1] < 2:
        return None
    return float(np.mean(np.argmax(a, axis=1) == np.argmax(b, axis=1)))
