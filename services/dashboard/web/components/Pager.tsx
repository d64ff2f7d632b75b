// Offset paging against X-Total-Count: the server counts, the page asks for one slice at a time.
interface PagerProps {
  offset: number;
  limit: number;
  total: number | null;
  shown: number;
  onOffset: (offset: number) => void;
}

export function Pager({ offset, limit, total, shown, onOffset }: PagerProps) {
  const last = offset + shown;
  const more = total === null ? shown === limit : last < total;
  return (
    <nav className="pager" aria-label="pages">
      <button type="button" disabled={offset === 0} onClick={() => onOffset(Math.max(0, offset - limit))}>
        ← newer
      </button>
      <span>
        {shown === 0 ? 0 : offset + 1}–{last}
        {total !== null ? ` of ${total}` : ""}
      </span>
      <button type="button" disabled={!more} onClick={() => onOffset(offset + limit)}>older →</button>
    </nav>
  );
}

/** Paging by seq (X-Next-Before): a stack of the `before` values that led here. */
interface CursorPagerProps {
  trail: string[];
  nextBefore: string | null;
  onTrail: (trail: string[]) => void;
}

export function CursorPager({ trail, nextBefore, onTrail }: CursorPagerProps) {
  return (
    <nav className="pager" aria-label="pages">
      <button type="button" disabled={trail.length === 0} onClick={() => onTrail([])}>newest</button>
      <button type="button" disabled={trail.length === 0} onClick={() => onTrail(trail.slice(0, -1))}>
        ← newer
      </button>
      <span>page {trail.length + 1}</span>
      <button type="button" disabled={!nextBefore} onClick={() => nextBefore && onTrail([...trail, nextBefore])}>
        older →
      </button>
    </nav>
  );
}
