"""Error measures used by every verification: SNR, cosine similarity, top-1 agreement (LSB error is
tosa.iospec.IOSpec.lsb_error: it needs the output's quantisation)."""

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


def nonfinite_mismatches(ref: np.ndarray, got: np.ndarray) -> int:
    """Elements where NaN, +inf or -inf in one is not the same in the other (they must match position for
    position: no distance measures them)."""
    r, g = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    return int(np.count_nonzero((np.isnan(r) != np.isnan(g)) | (np.isposinf(r) != np.isposinf(g))
                                | (np.isneginf(r) != np.isneginf(g))))


def compare_output(ref: np.ndarray, got: np.ndarray, flt: np.ndarray | None = None,
                   lsb: np.ndarray | None = None) -> dict:
    """Every measure of one output over N samples (arrays stacked on axis 0).

    Non-finite elements (NaN, inf) are compared by position (`nonfinite`, `nonfinite_mismatches`) and left
    out of the measures by value, so every measure is a finite number (report.json has no NaN)."""
    finite = np.isfinite(np.asarray(ref, np.float64)) & np.isfinite(np.asarray(got, np.float64))
    entry: dict = {}
    if not finite.all():
        entry = {"nonfinite": int(finite.size - np.count_nonzero(finite)),
                 "nonfinite_mismatches": nonfinite_mismatches(ref, got)}
        ref, got = np.asarray(ref)[finite], np.asarray(got)[finite]
        flt = np.asarray(flt)[finite] if flt is not None else None
    err = np.abs(np.asarray(ref, np.float64) - np.asarray(got, np.float64))
    entry = {
        "snr_db": snr_db(ref, got),
        "cosine": cosine(ref, got),
        "max_abs_error": float(err.max()) if err.size else 0.0,
        "mean_abs_error": float(err.mean()) if err.size else 0.0,
        **entry,
    }
    if np.asarray(ref).dtype.kind in "biu":  # bool, indices: exact or not
        entry["mismatched_elements"] = int(np.count_nonzero(err))
    if lsb is not None:
        entry["max_error_lsb"] = float(lsb.max()) if lsb.size else 0.0
        entry["mean_error_lsb"] = float(lsb.mean()) if lsb.size else 0.0
    flat_ref, flat_got = _classes(ref), _classes(got)
    t1 = top1_agreement(flat_ref, flat_got) if flat_ref is not None else None
    if t1 is not None:
        entry["top1_agreement"] = t1
    if flt is not None:
        kept = np.isfinite(np.asarray(flt, np.float64))  # the float model's own inf/NaN: nothing to measure
        entry["quant_snr_db"] = snr_db(np.asarray(flt)[kept], np.asarray(got)[kept])
        entry["quant_cosine"] = cosine(np.asarray(flt)[kept], np.asarray(got)[kept])
        flat_flt = _classes(flt)
        t1f = top1_agreement(flat_flt, flat_got) if flat_flt is not None else None
        if t1f is not None:
            entry["quant_top1_agreement"] = t1f
    return entry


def _classes(a: np.ndarray) -> np.ndarray | None:
    """(N, classes) view of a classifier output stacked over samples, or None if it is not one."""
    a = np.asarray(a)
    if a.ndim < 2:
        return None
    if a.ndim > 2 and any(d != 1 for d in a.shape[1:-1]):
        return None  # spatial outputs (segmentation maps, features) are not single-label classifiers
    return a.reshape(a.shape[0], -1)
