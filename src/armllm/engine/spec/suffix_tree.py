"""suffix_tree: the store suffix decoding drafts from. A trie of every suffix of the
sequences put in it, each cut to `max_depth` tokens, with how often each path was
taken, so "what followed this context, and how often" is a walk down from the
node the context reaches.

The trie is path-compressed: a node's edge label is a run of tokens read in place
from one stored sequence (`seq[pos:end]`), so n tokens make O(n) nodes. A node's
`count` is how many suffixes entered its edge and its `total` how many went on into
a child; a child's estimated probability is its count over its parent's total. A
suffix that stops inside an edge (its sequence ended there) is remembered in the
node's `ends` so the edge can still be split exactly later.

- SuffixWriter appends one sequence token by token, in amortized O(live) per token:
  the live suffixes are the sequence's suffixes that also occur earlier (the
  others are leaves, which grow with the sequence without being touched).
- follow() moves a reader's match positions (the context's suffixes found in a
  tree it does not write) on by one token; walk() finds one from the root.
- SuffixTree.insert / remove add and take out a whole finished sequence.
- draft() walks the most-entered path from a position."""
from __future__ import annotations

from collections.abc import Sequence


def _rank(item: tuple[int, Node]) -> tuple[int, int]:
    """Orders children: the higher count first, the lower token on a tie (a rule
    that does not depend on the order the counts grew in)."""
    token, child = item
    return child.count, -token


class Node:
    __slots__ = ("seq", "pos", "end", "count", "total", "children", "best", "parent", "ends")

    def __init__(self, seq: Sequence[int], pos: int, end: int, count: int,
                 parent: Node | None):
        # edge label: seq[pos:min(len(seq), end)]; a leaf of a sequence still being
        # written has `end` at its suffix's depth cap, so its label grows with seq
        self.seq = seq
        self.pos = pos
        self.end = end
        self.count = count        # suffixes that entered this edge
        self.total = 0            # of them, those that went on into a child
        self.children: dict[int, Node] | None = None   # first label token -> child
        # the child with the highest count, the lower first token on a tie (None
        # with children: to be found again, after a count went down)
        self.best: Node | None = None
        self.parent = parent
        self.ends: dict[int, int] | None = None   # offset in the label -> suffixes
                                                  # of finished sequences stopping there


class SuffixTree:
    """Suffixes of the sequences inserted, each at most max_depth tokens long."""

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"SuffixTree max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = Node((), 0, 0, 0, None)
        self.root.children = {}
        # changes on insert and remove: match positions read from an older version
        # may point into nodes that were split or dropped
        self.version = 0

    def insert(self, tokens: Sequence[int]) -> list[int]:
        """Adds a finished sequence; returns the list the tree reads it from (what
        remove() takes)."""
        writer = SuffixWriter(self, [], final_length=len(tokens))
        for token in tokens:
            writer.append(token)
        writer.finish()
        self.version += 1
        return writer.seq

    def remove(self, seq: list[int]) -> None:
        """Takes out a sequence insert() returned: every suffix's counts go down,
        nodes no suffix enters any more go, edges are cut back to what the
        remaining suffixes reach, and surviving labels stop reading from seq."""
        depth_cap = self.max_depth
        length = len(seq)
        for start in range(length):
            suffix_end = min(length, start + depth_cap)
            parent, at = self.root, start
            while True:
                child = parent.children[seq[at]]
                child.count -= 1
                parent.total -= 1
                if child.count == 0:
                    del parent.children[seq[at]]
                    if parent.best is child:
                        parent.best = None
                    _cut_back(parent)
                    break
                if parent.best is child:
                    parent.best = None        # may no longer be the highest
                label_len = min(len(child.seq), child.end) - child.pos
                if child.seq is seq:          # keep the label, not the whole sequence
                    child.seq = tuple(seq[child.pos:child.pos + label_len])
                    child.pos, child.end = 0, label_len
                taken = min(label_len, suffix_end - at)
                at += taken
                if at == suffix_end:
                    if taken < label_len:
                        _forget_end(child, taken)
                    _cut_back(child)
                    break
                parent = child
        self.version += 1

    def walk(self, tokens: Sequence[int]) -> tuple[Node, int] | None:
        """The position the token run reaches from the root (None: not in the tree)."""
        node, offset = self.root, 0
        for token in tokens:
            node, offset = step(node, offset, token)
            if node is None:
                return None
        return node, offset


def _forget_end(node: Node, offset: int) -> None:
    left = node.ends[offset] - 1
    if left:
        node.ends[offset] = left
    else:
        del node.ends[offset]
        if not node.ends:
            node.ends = None


def _cut_back(node: Node) -> None:
    """After a removal: shortens node's label to the furthest point a remaining
    suffix reaches (suffixes stopping at the label's end are not recorded: they are
    what count leaves over once the children and recorded stops are taken off)."""
    if node.parent is None or node.total:
        return
    stops_inside = sum(node.ends.values()) if node.ends else 0
    if node.count > stops_inside:
        return
    furthest = max(node.ends)
    del node.ends[furthest]
    if not node.ends:
        node.ends = None
    node.end = node.pos + furthest


class SuffixWriter:
    """Appends one sequence to a tree, one token at a time. `seq` is the list the
    tree's nodes read from: only this writer appends to it."""

    __slots__ = ("tree", "seq", "final_length", "nodes", "offsets")

    def __init__(self, tree: SuffixTree, seq: list[int], final_length: int | None = None):
        self.tree = tree
        self.seq = seq
        # known for a finished sequence: its leaves then end where it does, so every
        # node of a tree that is not being written has `end` <= len(seq)
        self.final_length = final_length
        # the live suffixes, longest first: entry i (of n) is the suffix of the last
        # n - i tokens, at tokens `offsets[i]` into the edge of `nodes[i]`. They are
        # exactly the suffixes shorter than max_depth that occur earlier: if one
        # does, so does every shorter one
        self.nodes: list[Node] = []
        self.offsets: list[int] = []

    def append(self, token: int) -> None:
        seq = self.seq
        seq.append(token)
        length = len(seq)
        tree = self.tree
        depth_cap = tree.max_depth
        nodes, offsets = self.nodes, self.offsets
        nodes.append(tree.root)
        offsets.append(0)
        num_live = len(nodes)
        # the suffixes that stop being live (now unique, or at the depth cap) are the
        # longest ones: a prefix of the list
        num_done = 0
        for i in range(num_live):
            node, offset = nodes[i], offsets[i]
            at = node.pos + offset
            # `end` alone tells: a live suffix inside a leaf of this sequence reads a
            # token before the new one, and other sequences' nodes end where they do
            if at < node.end:                              # inside the edge
                if node.seq[at] == token:
                    offsets[i] = offset + 1
                else:
                    self._split(i, token, length)
                    num_done = i + 1
                    continue
            else:                                          # at the end of the edge
                children = node.children
                child = children.get(token) if children else None
                if child is None:
                    self._add_leaf(node, token, length, num_live - i)
                    num_done = i + 1
                    continue
                child.count += 1
                node.total += 1
                best = node.best
                if best is not None and best is not child and (
                        child.count > best.count or child.count == best.count
                        and token < best.seq[best.pos]):
                    node.best = child
                nodes[i], offsets[i] = child, 1
            if num_live - i >= depth_cap:                  # at the cap: it stops here
                num_done = i + 1
        if num_done:
            del nodes[:num_done], offsets[:num_done]

    def finish(self) -> None:
        """The sequence ends: its live suffixes stop where they are (recorded when
        that is inside an edge)."""
        for node, offset in zip(self.nodes, self.offsets, strict=True):
            if node.pos + offset < min(len(node.seq), node.end):
                if node.ends is None:
                    node.ends = {}
                node.ends[offset] = node.ends.get(offset, 0) + 1
        self.nodes, self.offsets = [], []

    def _add_leaf(self, parent: Node, token: int, length: int, depth: int) -> None:
        end = length - depth + self.tree.max_depth
        if self.final_length is not None and self.final_length < end:
            end = self.final_length
        leaf = Node(self.seq, length - 1, end, 1, parent)
        if parent.children is None:
            parent.children = {}
        parent.children[token] = leaf
        parent.total += 1
        best = parent.best
        if best is None:
            if len(parent.children) == 1:
                parent.best = leaf
        elif best.count == 1 and token < best.seq[best.pos]:
            parent.best = leaf

    def _split(self, i: int, token: int, length: int) -> None:
        """Live suffix i, inside node's edge, goes on with a token the edge does not:
        the edge splits there, into an upper node ending at the split and the node
        (now the lower part) under it, beside a new leaf for the token."""
        nodes, offsets = self.nodes, self.offsets
        node, offset = nodes[i], offsets[i]
        # the shorter live suffixes in this edge stop above the split (they are
        # shallower), and so does suffix i: none of them reaches the lower part
        shorter_inside = sum(1 for j in range(i + 1, len(nodes)) if nodes[j] is node)
        recorded_above = 0
        upper_ends = lower_ends = None
        if node.ends:
            upper_ends, lower_ends = {}, {}
            for at, num in node.ends.items():
                if at <= offset:
                    recorded_above += num
                    if at < offset:
                        upper_ends[at] = num
                else:
                    lower_ends[at - offset] = num
        lower_count = node.count - recorded_above - shorter_inside - 1
        upper = Node(node.seq, node.pos, node.pos + offset, node.count, node.parent)
        upper.ends = upper_ends or None
        parent = node.parent
        parent.children[node.seq[node.pos]] = upper
        if parent.best is node:
            parent.best = upper
        node.pos += offset
        node.count = lower_count
        node.parent = upper
        node.ends = lower_ends or None
        upper.children = {node.seq[node.pos]: node}
        upper.total = lower_count
        upper.best = node
        for j in range(i + 1, len(nodes)):
            if nodes[j] is node:
                nodes[j] = upper
        self._add_leaf(upper, token, length, len(nodes) - i)


def step(node: Node, offset: int, token: int) -> tuple[Node | None, int]:
    """The position one token on from (node, offset), or (None, 0) if the tree has
    no such path."""
    at = node.pos + offset
    if at < node.end and at < len(node.seq):               # inside the edge
        return (node, offset + 1) if node.seq[at] == token else (None, 0)
    children = node.children
    child = children.get(token) if children else None
    return (child, 1) if child is not None else (None, 0)


def follow(tree: SuffixTree, nodes: list[Node], offsets: list[int], token: int) -> None:
    """Moves match positions in a tree no writer is extending (every node's `end`
    within its sequence) on by `token`. As a writer's live suffixes: longest first,
    entry i of n the match of the last n - i tokens; those that cannot take the
    token or reach the depth cap are dropped (always the longest ones), and the
    match of `token` alone is added."""
    nodes.append(tree.root)
    offsets.append(0)
    num = len(nodes)
    depth_cap = tree.max_depth
    num_done = 0
    for i in range(num):
        node, offset = nodes[i], offsets[i]
        at = node.pos + offset
        if at < node.end:                                  # inside the edge
            if node.seq[at] != token or num - i >= depth_cap:
                num_done = i + 1
            else:
                offsets[i] = offset + 1
            continue
        children = node.children
        child = children.get(token) if children else None
        if child is None or num - i >= depth_cap:
            num_done = i + 1
        else:
            nodes[i], offsets[i] = child, 1
    if num_done:
        del nodes[:num_done], offsets[:num_done]


def draft(node: Node, offset: int, max_tokens: int, min_prob: float) -> tuple[list[int], float]:
    """The most-entered path from a position: up to max_tokens tokens, stopping
    before a token whose probability (the product of its path's count shares)
    falls below min_prob. Returns the tokens and their summed probabilities."""
    tokens: list[int] = []
    score = 0.0
    prob = 1.0
    while len(tokens) < max_tokens:
        seq = node.seq
        at = node.pos + offset
        label_end = min(len(seq), node.end)
        if at < label_end:                 # inside an edge: the one way on
            take = min(label_end - at, max_tokens - len(tokens))
            tokens += seq[at:at + take]
            for _ in range(take):          # a sum, token by token: the same float
                score += prob              # however the path is cut into edges
            offset += take
            continue
        if not node.children:
            break
        best = node.best
        if best is None:
            best = node.best = max(node.children.items(), key=_rank)[1]
        prob *= best.count / node.total
        if prob < min_prob:
            break
        node, offset = best, 0
    return tokens, score
