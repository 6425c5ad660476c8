# sample.pxi: included by _ext.pyx: RowSampler (a step's logits rows to tokens in one
# call on the pool: sample.h), the uniform draw it uses, the structured-output mask of
# a row.

from libc.math cimport INFINITY

# the largest temperature a column may hold (SamplingParams' bound too)
cdef float MAX_TEMPERATURE = 100.0
# the DRY window (ids) the scratch first holds; it grows to the largest a run needs
cdef int64_t DRY_WINDOW_START = 1024


cdef class RowSampler:
    """The sampling of up to max_rows logits rows of vocab_size tokens (sample.h), with
    one numpy column per parameter, max_rows long, that the caller fills: float32
    temperature, top_p, min_p, repetition_penalty, presence_penalty,
    frequency_penalty; int32 top_k (<= 0: off), num_logprobs (-1: none), mask_row (-1:
    none); int8 keep_row (nonzero: the draw leaves the row as it is: only its mask,
    bias and penalties change it); uint64 seed, stream, counter (the draw's, armllm_sample_uniform); int64
    prompt_len (set by set_history); DRY's float32 dry_multiplier (0: off), dry_base,
    int32 dry_allowed_length, int64 dry_last_n (-1: the whole history, 0: off); XTC's
    float32 xtc_probability (0: off), xtc_threshold (> 0.5: off). set_bad_words and
    set_breakers attach sequence lists (sample.h; sequence_list builds one). run() writes token (int32), logprob (float32, the
    sampled token's, NaN without num_logprobs) and top_ids / top_logprobs (int32 /
    float32 [max_rows, 20]: the num_logprobs best, then -1 / NaN). Histories and
    biases are the caller's arrays, referenced until cleared or replaced. One run at a
    time: the workers' scratch is the sampler's."""
    cdef const armllm_kernels *kt
    cdef readonly int64_t vocab_size, max_rows, slots
    cdef readonly object temperature, top_p, min_p, repetition_penalty, presence_penalty
    cdef readonly object frequency_penalty, top_k, num_logprobs, mask_row, keep_row
    cdef readonly object seed, stream, counter, prompt_len
    cdef readonly object dry_multiplier, dry_base, dry_allowed_length, dry_last_n
    cdef readonly object xtc_probability, xtc_threshold
    cdef object bad_word_ptrs, breaker_ptrs, dry_scratch
    cdef list bad_words, breakers
    cdef void *dry_scratch_p
    cdef readonly int64_t dry_window
    cdef readonly object token, logprob, top_ids, top_logprobs
    cdef object history_len, bias_len, row_ptrs, history_ptrs, bias_id_ptrs, bias_value_ptrs
    cdef object scratch
    cdef list histories, biases
    cdef void *scratch_p

    def __init__(self, Kernels kernels, int64_t vocab_size, int64_t max_rows, int64_t slots):
        """kernels: the table whose slots run; slots: the most workers a run uses (each
        has scratch of about 20 bytes a token: armllm_sample_rows_slot_bytes)."""
        if vocab_size < 1 or vocab_size > 2**31 - 1:
            raise ValueError(f"vocab_size must be in [1, 2**31 - 1], got {vocab_size}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.kt, self.vocab_size, self.max_rows, self.slots = kernels.t, vocab_size, max_rows, slots
        col = lambda dtype, fill: np.full(max_rows, fill, dtype)
        self.temperature, self.top_p, self.min_p = col(np.float32, 1), col(np.float32, 1), \
            col(np.float32, 0)
        self.repetition_penalty = col(np.float32, 1)
        self.presence_penalty, self.frequency_penalty = col(np.float32, 0), col(np.float32, 0)
        self.top_k, self.num_logprobs, self.mask_row = col(np.int32, 0), col(np.int32, -1), \
            col(np.int32, -1)
        self.keep_row = col(np.int8, 0)
        self.seed, self.stream, self.counter = col(np.uint64, 0), col(np.uint64, 0), \
            col(np.uint64, 0)
        self.prompt_len, self.history_len, self.bias_len = col(np.int64, 0), col(np.int64, 0), \
            col(np.int64, 0)
        self.token, self.logprob = col(np.int32, -1), col(np.float32, np.nan)
        self.top_ids = np.full((max_rows, ARMLLM_SAMPLE_MAX_LOGPROBS), -1, np.int32)
        self.top_logprobs = np.full((max_rows, ARMLLM_SAMPLE_MAX_LOGPROBS), np.nan, np.float32)
        self.row_ptrs, self.history_ptrs = col(np.uintp, 0), col(np.uintp, 0)
        self.bias_id_ptrs, self.bias_value_ptrs = col(np.uintp, 0), col(np.uintp, 0)
        self.histories, self.biases = [None] * max_rows, [None] * max_rows
        self.dry_multiplier, self.dry_base = col(np.float32, 0), col(np.float32, 1.75)
        self.dry_allowed_length, self.dry_last_n = col(np.int32, 2), col(np.int64, -1)
        self.xtc_probability, self.xtc_threshold = col(np.float32, 0), col(np.float32, 0.1)
        self.bad_word_ptrs, self.breaker_ptrs = col(np.uintp, 0), col(np.uintp, 0)
        self.bad_words, self.breakers = [None] * max_rows, [None] * max_rows
        self.dry_window, self.dry_scratch, self.dry_scratch_p = 0, None, NULL
        # zeroed (the kernel's marks start at 0) and 64-byte aligned (sample.h): a spare
        # cache line to align within
        cdef size_t line = 64, nbytes = slots * armllm_sample_rows_slot_bytes(vocab_size)
        self.scratch = np.zeros(nbytes + line, np.uint8)
        cdef uintptr_t base = _addr(self.scratch)
        self.scratch_p = <void *>((base + line - 1) // line * line)

    cdef int64_t _entry(self, int64_t r) except -1:
        if not 0 <= r < self.max_rows:
            raise ValueError(f"row {r} is outside the columns [0, {self.max_rows})")
        return r

    def set_history(self, int64_t r, ids, int64_t length, int64_t prompt_len):
        """Entry r's penalties look at ids[:length] (int32): the prompt's prompt_len
        ids, then the output's. The array is referenced, not copied: entries below
        length may change between runs (run checks them)."""
        self._entry(r)
        cdef cnp.ndarray ia = _ids_array(ids, "ids")
        if not 0 <= length <= ia.shape[0]:
            raise ValueError(f"length must be in [0, {ia.shape[0]}] (the ids), got {length}")
        if not 0 <= prompt_len <= length:
            raise ValueError(f"prompt_len must be in [0, {length}] (the length), got {prompt_len}")
        _check_ids(ia, length, self.vocab_size, f"history ids of row {r}")
        self.histories[r] = ia
        self.history_ptrs[r] = _addr(ia)
        self.history_len[r] = length
        self.prompt_len[r] = prompt_len

    def clear_history(self, int64_t r):
        self._entry(r)
        self.histories[r] = None
        self.history_ptrs[r] = 0
        self.history_len[r] = 0
        self.prompt_len[r] = 0

    def set_bias(self, int64_t r, ids, values):
        """Entry r adds values[j] (float32, finite) to the logit of ids[j] (int32), in
        order. The arrays are referenced, not copied."""
        self._entry(r)
        cdef cnp.ndarray ia = _ids_array(ids, "ids")
        cdef cnp.ndarray va = np.asarray(values)
        if va.dtype != np.float32 or va.ndim != 1 or (va.shape[0] and not va.flags.c_contiguous):
            raise ValueError(f"values must be a contiguous 1-D float32 array, got {va.dtype} "
                             f"{_shp(va)}")
        if va.shape[0] != ia.shape[0]:
            raise ValueError(f"values must have one entry per id ({ia.shape[0]}), "
                             f"got {va.shape[0]}")
        if not np.isfinite(va).all():
            raise ValueError(f"bias values of row {r} must be finite, got "
                             f"{va[~np.isfinite(va)][0]}")
        _check_ids(ia, ia.shape[0], self.vocab_size, f"bias ids of row {r}")
        self.biases[r] = (ia, va)
        self.bias_id_ptrs[r] = _addr(ia) if ia.shape[0] else 0
        self.bias_value_ptrs[r] = _addr(va) if va.shape[0] else 0
        self.bias_len[r] = ia.shape[0]

    def set_bad_words(self, int64_t r, words):
        """Entry r bans the last id of each sequence of `words` (a sequence list,
        sample.h step 1b) where the output ends with the others. Referenced, not
        copied."""
        self._entry(r)
        self.bad_words[r] = _sequence_list(words, self.vocab_size, False, f"bad words of row {r}")
        self.bad_word_ptrs[r] = _addr(self.bad_words[r])

    def clear_bad_words(self, int64_t r):
        self._entry(r)
        self.bad_words[r] = None
        self.bad_word_ptrs[r] = 0

    def set_breakers(self, int64_t r, breakers):
        """Entry r's DRY sequence breakers: a sequence list sorted by (head, length)
        (sample.h step 4b). Referenced, not copied."""
        self._entry(r)
        self.breakers[r] = _sequence_list(breakers, self.vocab_size, True,
                                          f"DRY breakers of row {r}")
        self.breaker_ptrs[r] = _addr(self.breakers[r])

    def clear_breakers(self, int64_t r):
        self._entry(r)
        self.breakers[r] = None
        self.breaker_ptrs[r] = 0

    def clear_bias(self, int64_t r):
        self._entry(r)
        self.biases[r] = None
        self.bias_id_ptrs[r] = 0
        self.bias_value_ptrs[r] = 0
        self.bias_len[r] = 0

    def run(self, logits, int64_t begin, int64_t end, masks=None, ThreadPool pool=None):
        """Samples column entries begin..end-1 from rows 0..end-begin-1 of logits
        (float32 [>= end - begin, vocab_size], rows contiguous, strided allowed; used
        as scratch: their values afterwards are unspecified); masks: int32 or uint32
        [mask rows, ceil(vocab_size / 32)] (llguidance's bitmask) that mask_row
        indexes. The outputs land in token, logprob, top_ids and top_logprobs."""
        if self.kt == NULL:
            raise ValueError("RowSampler was not initialized")
        if not 0 <= begin <= end <= self.max_rows:
            raise ValueError(f"begin and end must satisfy 0 <= begin <= end <= {self.max_rows}, "
                             f"got {begin} and {end}")
        cdef int64_t rows = end - begin, n = self.vocab_size, i
        if rows == 0:
            return
        cdef cnp.ndarray la = _array(logits, "logits", np.float32, 2)
        _writable(la, "logits")
        if la.shape[0] < rows or la.shape[1] != n:
            raise ValueError(f"logits must have at least {rows} rows of {n}, got {_shp(la)}")
        cdef armllm_sample_batch b
        b.masks, b.mask_ld = NULL, 0
        cdef int64_t mask_rows = 0
        cdef cnp.ndarray ma
        if masks is not None:
            ma = _array(masks, "masks", np.uint32 if getattr(masks, "dtype", None) == np.uint32
                        else np.int32, 2)
            if ma.shape[1] != (n + 31) // 32:
                raise ValueError(f"masks must hold {(n + 31) // 32} words a row for "
                                 f"{n} tokens, got {ma.shape[1]}")
            _no_overlap(ma, "masks", la, "logits")
            b.masks, b.mask_ld, mask_rows = <const uint32_t *>cnp.PyArray_DATA(ma), _ld(ma), \
                ma.shape[0]
        self._check_entries(begin, end, mask_rows)
        self._fit_dry_window(begin, end)
        cdef uintptr_t *row_p = <uintptr_t *>cnp.PyArray_DATA(<cnp.ndarray>self.row_ptrs)
        cdef uintptr_t row0 = _addr(la)
        cdef int64_t ld_bytes = la.strides[0]
        for i in range(rows):
            row_p[i] = row0 + <uintptr_t>(i * ld_bytes)
        b.rows, b.n = rows, n
        b.row = <float **>row_p
        b.temperature = <const float *>_col(self.temperature, begin)
        b.top_p = <const float *>_col(self.top_p, begin)
        b.min_p = <const float *>_col(self.min_p, begin)
        b.repetition_penalty = <const float *>_col(self.repetition_penalty, begin)
        b.presence_penalty = <const float *>_col(self.presence_penalty, begin)
        b.frequency_penalty = <const float *>_col(self.frequency_penalty, begin)
        b.top_k = <const int32_t *>_col(self.top_k, begin)
        b.num_logprobs = <const int32_t *>_col(self.num_logprobs, begin)
        b.seed = <const uint64_t *>_col(self.seed, begin)
        b.stream = <const uint64_t *>_col(self.stream, begin)
        b.counter = <const uint64_t *>_col(self.counter, begin)
        b.history = <const int32_t **>_col(self.history_ptrs, begin)
        b.history_len = <const int64_t *>_col(self.history_len, begin)
        b.prompt_len = <const int64_t *>_col(self.prompt_len, begin)
        b.bias_ids = <const int32_t **>_col(self.bias_id_ptrs, begin)
        b.bias_values = <const float **>_col(self.bias_value_ptrs, begin)
        b.bias_len = <const int64_t *>_col(self.bias_len, begin)
        b.mask_row = <const int32_t *>_col(self.mask_row, begin)
        b.keep_row = <const int8_t *>_col(self.keep_row, begin)
        b.bad_words = <const int32_t **>_col(self.bad_word_ptrs, begin)
        b.dry_multiplier = <const float *>_col(self.dry_multiplier, begin)
        b.dry_base = <const float *>_col(self.dry_base, begin)
        b.dry_allowed_length = <const int32_t *>_col(self.dry_allowed_length, begin)
        b.dry_last_n = <const int64_t *>_col(self.dry_last_n, begin)
        b.dry_breakers = <const int32_t **>_col(self.breaker_ptrs, begin)
        b.xtc_probability = <const float *>_col(self.xtc_probability, begin)
        b.xtc_threshold = <const float *>_col(self.xtc_threshold, begin)
        b.dry_scratch, b.dry_window = self.dry_scratch_p, self.dry_window
        b.token = <int32_t *>_col(self.token, begin)
        b.logprob = <float *>_col(self.logprob, begin)
        b.top_ids = <int32_t *>_col(self.top_ids, begin)
        b.top_logprobs = <float *>_col(self.top_logprobs, begin)
        b.scratch, b.slots = self.scratch_p, self.slots
        cdef armllm_pool *p = _pool_ptr(pool)
        with nogil:
            armllm_sample_rows(self.kt, p, &b)

    cdef int _fit_dry_window(self, int64_t begin, int64_t end) except -1:
        """Grows the DRY scratch to the largest window of entries begin..end-1."""
        cdef const float *mult = <const float *>_col(self.dry_multiplier, 0)
        cdef const int64_t *last_n = <const int64_t *>_col(self.dry_last_n, 0)
        cdef const int64_t *hist_len = <const int64_t *>_col(self.history_len, 0)
        cdef int64_t r, window, need = 0
        for r in range(begin, end):
            if mult[r] > 0 and last_n[r] != 0:
                window = hist_len[r] if last_n[r] < 0 else min(hist_len[r], last_n[r])
                need = max(need, window)
        if need <= self.dry_window:
            return 0
        need = max(need, 2 * self.dry_window, DRY_WINDOW_START)
        cdef size_t line = 64, nbytes = self.slots * armllm_sample_dry_bytes(need)
        self.dry_scratch = np.empty(nbytes + line, np.uint8)
        cdef uintptr_t base = _addr(self.dry_scratch)
        self.dry_scratch_p = <void *>((base + line - 1) // line * line)
        self.dry_window = need
        return 0

    cdef int _check_entries(self, int64_t begin, int64_t end, int64_t mask_rows) except -1:
        """Raises a ValueError naming the first bad value of entries begin..end-1."""
        cdef const float *temp = <const float *>_col(self.temperature, 0)
        cdef const float *top_p = <const float *>_col(self.top_p, 0)
        cdef const float *min_p = <const float *>_col(self.min_p, 0)
        cdef const float *rep = <const float *>_col(self.repetition_penalty, 0)
        cdef const float *pres = <const float *>_col(self.presence_penalty, 0)
        cdef const float *freq = <const float *>_col(self.frequency_penalty, 0)
        cdef const int32_t *top_k = <const int32_t *>_col(self.top_k, 0)
        cdef const int32_t *n_lp = <const int32_t *>_col(self.num_logprobs, 0)
        cdef const int32_t *mask_row = <const int32_t *>_col(self.mask_row, 0)
        cdef const int64_t *bias_len = <const int64_t *>_col(self.bias_len, 0)
        cdef const int64_t *prompt = <const int64_t *>_col(self.prompt_len, 0)
        cdef const int64_t *hist_len = <const int64_t *>_col(self.history_len, 0)
        cdef const float *dry_mult = <const float *>_col(self.dry_multiplier, 0)
        cdef const float *dry_base = <const float *>_col(self.dry_base, 0)
        cdef const int32_t *dry_allowed = <const int32_t *>_col(self.dry_allowed_length, 0)
        cdef const int64_t *dry_last_n = <const int64_t *>_col(self.dry_last_n, 0)
        cdef const float *xtc_p = <const float *>_col(self.xtc_probability, 0)
        cdef const float *xtc_t = <const float *>_col(self.xtc_threshold, 0)
        cdef int64_t r
        cdef bint dry
        for r in range(begin, end):
            if not 0 <= temp[r] <= MAX_TEMPERATURE:
                raise ValueError(f"temperature[{r}] must be in [0, 100], got {temp[r]}")
            if not 0 < top_p[r] <= 1:
                raise ValueError(f"top_p[{r}] must be in (0, 1], got {top_p[r]}")
            if not 0 <= min_p[r] <= 1:
                raise ValueError(f"min_p[{r}] must be in [0, 1], got {min_p[r]}")
            if top_k[r] < -1:
                raise ValueError(f"top_k[{r}] must be >= -1, got {top_k[r]}")
            if not -1 <= n_lp[r] <= ARMLLM_SAMPLE_MAX_LOGPROBS:
                raise ValueError(f"num_logprobs[{r}] must be in [-1, 20], got {n_lp[r]}")
            if not -1 <= mask_row[r] < mask_rows:
                raise ValueError(f"mask_row[{r}] must be -1 or a row of masks [0, {mask_rows}),"
                                 f" got {mask_row[r]}")
            if not (0 < rep[r] < INFINITY):
                raise ValueError(f"repetition_penalty[{r}] must be finite and > 0, got {rep[r]}")
            if not (-INFINITY < pres[r] < INFINITY and -INFINITY < freq[r] < INFINITY):
                raise ValueError(f"presence_penalty[{r}] and frequency_penalty[{r}] must be "
                                 f"finite, got {pres[r]} and {freq[r]}")
            if not 0 <= prompt[r] <= hist_len[r]:
                raise ValueError(f"prompt_len[{r}] must be in [0, {hist_len[r]}] (the history's "
                                 f"length), got {prompt[r]}")
            if not (0 <= dry_mult[r] < INFINITY):
                raise ValueError(f"dry_multiplier[{r}] must be finite and >= 0, "
                                 f"got {dry_mult[r]}")
            if not (1 <= dry_base[r] < INFINITY):
                raise ValueError(f"dry_base[{r}] must be finite and >= 1, got {dry_base[r]}")
            if dry_allowed[r] < 0:
                raise ValueError(f"dry_allowed_length[{r}] must be >= 0, got {dry_allowed[r]}")
            if dry_last_n[r] < -1:
                raise ValueError(f"dry_last_n[{r}] must be >= -1, got {dry_last_n[r]}")
            if not (0 <= xtc_p[r] <= 1 and 0 <= xtc_t[r] <= 1):
                raise ValueError(f"xtc_probability[{r}] and xtc_threshold[{r}] must be in "
                                 f"[0, 1], got {xtc_p[r]} and {xtc_t[r]}")
            dry = dry_mult[r] > 0 and dry_last_n[r] != 0
            if dry and self.breakers[r] is not None:
                _sequence_list(self.breakers[r], self.vocab_size, True,
                               f"DRY breakers of row {r}")
            if self.bad_words[r] is not None:
                _sequence_list(self.bad_words[r], self.vocab_size, False,
                               f"bad words of row {r}")
            if rep[r] != 1 or pres[r] != 0 or freq[r] != 0 or dry:
                hist = self.histories[r]
                if hist is not None:
                    _check_ids(hist, hist_len[r], self.vocab_size,
                               f"history ids of row {r}")
            if bias_len[r] > 0:
                _check_ids(self.biases[r][0], bias_len[r], self.vocab_size,
                           f"bias ids of row {r}")
        return 0


cdef cnp.ndarray _sequence_list(object seqs, int64_t n, bint by_head, str what):
    """seqs checked as a sequence list (sample.h) of ids in [0, n), sorted by (head,
    length) if by_head; raises a ValueError naming `what` otherwise."""
    cdef cnp.ndarray a = _ids_array(seqs, what)
    cdef const int32_t *p = <const int32_t *>cnp.PyArray_DATA(a)
    cdef int64_t size = a.shape[0], count, j, at, length, i, head = -1, prev_len = 0
    if size < 1 or not 0 <= p[0] <= size - 1:
        raise ValueError(f"{what}: a sequence list starts with its count of sequences")
    count = p[0]
    for j in range(count):
        at = p[1 + j]
        if not 1 + count <= at < size or not 1 <= p[at] <= size - at - 1:
            raise ValueError(f"{what}: sequence {j} lies outside the list")
        length = p[at]
        for i in range(length):
            if not 0 <= p[at + 1 + i] < n:
                raise ValueError(f"{what} must be in [0, {n}), got {p[at + 1 + i]}")
        if by_head:
            if p[at + 1] < head or (p[at + 1] == head and length < prev_len):
                raise ValueError(f"{what} must be sorted by (head, length)")
            head, prev_len = p[at + 1], length
    return a


def sequence_list(seqs) -> np.ndarray:
    """The sequence list (sample.h: int32 [S, offsets, then each as [len, ids]]) of
    non-empty id sequences, sorted by (head, length, ids) and without repeats."""
    uniq = sorted({tuple(int(t) for t in s) for s in seqs}, key=lambda s: (s[:1], len(s), s))
    if any(not s for s in uniq):
        raise ValueError("a sequence of a sequence list must hold at least one id")
    out = [len(uniq)]
    at = 1 + len(uniq)
    for s in uniq:
        out.append(at)
        at += 1 + len(s)
    for s in uniq:
        out += [len(s), *s]
    return np.asarray(out, np.int32)


cdef inline void *_col(object column, int64_t begin):
    """The address of entry `begin` of a column (its row, for 2-D ones)."""
    cdef cnp.ndarray a = <cnp.ndarray>column
    return <void *>(<char *>cnp.PyArray_DATA(a) + begin * a.strides[0])


cdef cnp.ndarray _ids_array(object ids, str name):
    """ids as a contiguous 1-D int32 array (empty allowed)."""
    if not isinstance(ids, cnp.ndarray) or ids.dtype != np.int32 or ids.ndim != 1:
        raise ValueError(f"{name} must be a 1-D int32 numpy array, got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} {getattr(ids, 'shape', '')}")
    if ids.shape[0] and not ids.flags.c_contiguous:
        raise ValueError(f"{name} must be contiguous")
    return <cnp.ndarray>ids


cdef int _check_ids(cnp.ndarray ids, int64_t length, int64_t n, str what) except -1:
    """Raises unless ids[:length] all lie in [0, n)."""
    cdef const int32_t *p = <const int32_t *>cnp.PyArray_DATA(ids)
    cdef int64_t i
    for i in range(length):
        if not 0 <= p[i] < n:
            raise ValueError(f"{what} must be in [0, {n}), got {p[i]} at {i}")
    return 0


def sample_uniform(seed, stream, counter):
    """The uniform draw in [0, 1) of (seed, stream, counter), each an integer in
    [0, 2**64) (sample.h: splitmix64's finalizer, counter-based)."""
    for name, v in (("seed", seed), ("stream", stream), ("counter", counter)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= v < 2**64:
            raise ValueError(f"{name} must be an integer in [0, 2**64), got {v!r}")
    return armllm_sample_uniform(<uint64_t>int(seed), <uint64_t>int(stream), <uint64_t>int(counter))


def mask_logits(row, words):
    """Sets row[i] (float32) to -inf where bit i % 32 of words[i // 32] (int32 or
    uint32, llguidance's token bitmask) is 0 (sample.h)."""
    cdef cnp.ndarray ra = _array(row, "row", np.float32, 1)
    _writable(ra, "row")
    cdef cnp.ndarray wa = _array(words, "words", np.uint32 if getattr(words, "dtype", None) == np.uint32
                                 else np.int32, 1)
    cdef int64_t n = ra.shape[0]
    if wa.shape[0] != (n + 31) // 32:
        raise ValueError(f"words must hold {(n + 31) // 32} entries for a row of {n}, "
                         f"got {wa.shape[0]}")
    cdef float *rp = <float *>cnp.PyArray_DATA(ra)
    cdef const uint32_t *wp = <const uint32_t *>cnp.PyArray_DATA(wa)
    with nogil:
        armllm_mask_logits(rp, n, wp)
