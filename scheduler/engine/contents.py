"""What the local score plugins read of a node (`scoring_content`), and each node's content numbered, kept current
from the change log (`_numbers_now`): nodes alike in it share one computation of a shape's raw scores
(`Scoring._local_raw`) and of its filter answers (`Sampling._content_number`)."""

from __future__ import annotations

from collections.abc import Iterable

from kubegpu.core.plugin_manager import PLUGIN_ERRORS
from kubegpu.scheduler.engine.filtering import Filtering
from kubegpu.scheduler.engine.records import NodeRecord, log

CONTENTS_REMEMBERED = 1 << 16  # contents numbered, entries of `_contents`, of a shape's `by_number`: past it, dropped


class Contents(Filtering):
    """Nodes' contents as the local scores read them, numbered."""

    def _numbers_now(self) -> dict[str, int | None]:
        """Each node's scoring content's number now (`records.ScoreNumbers`; None: the node is scored alone), kept
        current from the change log: only the nodes it names since the last call are numbered again."""
        book = self._score_numbers
        generation = self.generation
        if book.generation == generation:
            return book.by_name
        changed: Iterable[str] | None = self.changed_since(book.generation) if book.generation >= 0 else None
        numbers, by_name, nodes = book.numbers, book.by_name, self.nodes
        if changed is None or len(numbers) + len(nodes) > CONTENTS_REMEMBERED:
            numbers.clear()
            by_name.clear()
            book.epoch += 1
            changed = nodes.keys()
        for name in changed:
            record = nodes.get(name)
            if record is None:
                by_name.pop(name, None)
                continue
            content = self.scoring_content(record)
            by_name[name] = None if content is None else numbers.setdefault(content, len(numbers))
        book.generation = generation
        return by_name

    def scoring_content(self, record: NodeRecord) -> tuple[object, ...] | None:
        """What the local score plugins read of a node besides its name: its class (`NodeCache._klass`: labels but
        the hostname, allocatable, taints), its usage, and each of its device plugins' states' `scoring_content()`
        (a plugin state that has none, or whose content is the state itself, `(state,)`, is scored alone: None; the
        state's identity stays one key while its books change, so answers remembered by it went stale). Remembered
        per node version (`_contents`)."""
        known = self._contents.get(record.name)
        if known is not None and known[0] is record and known[1] == record.version:
            return known[2]
        parts: list[tuple[str, object]] | None = []
        for plugin, state in record.states.items():
            method = getattr(state, "scoring_content", None)
            if method is None:
                parts = None
                break
            try:
                part = method()
                hash(part)  # numbered by `_numbers_now`: a plugin's list (of its holders, say) cannot be one
                if type(part) is tuple and len(part) == 1 and part[0] is state:
                    parts = None  # the state is its own content (the kit's shared books): one key while it changes
                    break
            except PLUGIN_ERRORS as exc:  # a plugin's own method: it costs its node the sharing, not the cycle
                log.error("node %s: plugin %s: scoring_content() is no key, the node is scored alone: %r",
                          record.name, plugin, exc)  # fmt: skip
                parts = None
                break
            parts.append((plugin, part))  # type: ignore[union-attr]  # a list until None
        content = None
        if parts is not None:
            content = (
                record.klass,
                tuple(sorted(record.used.items())),
                record.nonzero_cpu,
                record.nonzero_memory,
                tuple(parts),
            )
        if len(self._contents) >= CONTENTS_REMEMBERED:
            self._contents.clear()
        self._contents[record.name] = (record, record.version, content)
        return content
