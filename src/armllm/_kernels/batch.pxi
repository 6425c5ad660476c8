# batch.pxi: included by _ext.pyx before layer.pxi: StepBatch, one step's batch
# metadata as the bound layers read it (checked once for every layer).


cdef struct BatchArgs:
    int64_t rows
    const int32_t *positions
    const int32_t *slot_mapping
    const int32_t *block_table
    const int32_t *seq_lens
    const int32_t *query_start
    const int32_t *state_slots    # [n_seqs] each sequence's recurrent state slot (NULL: none)
    int64_t n_seqs, max_blocks


cdef class StepBatch:
    """One step's batch metadata (model/decoder.py's BatchMeta) as DecoderLayer.run
    reads it: positions and slot_mapping [T] int32, block_table [B, max_blocks],
    seq_lens [B] and query_start [B + 1] int32, and for a hybrid model's recurrent
    layers state_slots [B] int32, checked once for every layer."""
    cdef BatchArgs a
    cdef tuple keep

    def __init__(self, positions, slot_mapping, block_table, seq_lens, query_start,
                 state_slots=None):
        cdef cnp.ndarray pa = _array(positions, "positions", np.int32, 1)
        cdef cnp.ndarray sa = _array(slot_mapping, "slot_mapping", np.int32, 1)
        cdef cnp.ndarray bt = _array(block_table, "block_table", np.int32, 2)
        cdef cnp.ndarray sl = _array(seq_lens, "seq_lens", np.int32, 1)
        cdef cnp.ndarray qs = _array(query_start, "query_start", np.int32, 1)
        self.keep = (pa, sa, bt, sl, qs)
        self.a.rows, self.a.n_seqs = pa.shape[0], sl.shape[0]
        if sa.shape[0] != self.a.rows:
            raise ValueError(f"slot_mapping has {sa.shape[0]} entries for {self.a.rows} positions")
        if qs.shape[0] != self.a.n_seqs + 1 or bt.shape[0] != self.a.n_seqs or _ld(bt) != bt.shape[1]:
            raise ValueError(f"query_start must have n_seqs+1 = {self.a.n_seqs + 1} entries and "
                             f"block_table n_seqs C-contiguous rows, got {qs.shape[0]} and "
                             f"{_shp(bt)}")
        self.a.query_start = <const int32_t *>cnp.PyArray_DATA(qs)
        if self.a.query_start[self.a.n_seqs] != self.a.rows:
            raise ValueError(f"query_start[-1] = {self.a.query_start[self.a.n_seqs]}, but the batch "
                             f"has {self.a.rows} rows")
        self.a.positions = <const int32_t *>cnp.PyArray_DATA(pa)
        self.a.slot_mapping = <const int32_t *>cnp.PyArray_DATA(sa)
        self.a.block_table = <const int32_t *>cnp.PyArray_DATA(bt)
        self.a.seq_lens = <const int32_t *>cnp.PyArray_DATA(sl)
        self.a.max_blocks = bt.shape[1]
        self.a.state_slots = NULL
        cdef cnp.ndarray ss
        if state_slots is not None:
            ss = _array(state_slots, "state_slots", np.int32, 1)
            if ss.shape[0] != self.a.n_seqs:
                raise ValueError(f"state_slots has {ss.shape[0]} entries for {self.a.n_seqs} "
                                 f"sequences")
            self.keep = (pa, sa, bt, sl, qs, ss)
            self.a.state_slots = <const int32_t *>cnp.PyArray_DATA(ss)


    @property
    def rows(self):
        return self.a.rows
