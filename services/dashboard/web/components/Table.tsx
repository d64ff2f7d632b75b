// A table of rows, one column definition each; wide tables scroll sideways on a phone instead of
// squeezing. `rowKey` keeps rows stable when a live refetch reorders them.
import type { ReactNode } from "react";

export interface Column<T> {
  title: string;
  cell: (row: T) => ReactNode;
  className?: string;
}

interface TableProps<T> {
  rows: T[];
  columns: Column<T>[];
  rowKey: (row: T) => string;
  empty?: ReactNode;
  label?: string;
}

export function Table<T>({ rows, columns, rowKey, empty = "nothing here yet", label }: TableProps<T>) {
  return (
    <div className="table-wrap">
      <table aria-label={label}>
        <thead>
          <tr>
            {columns.map((c) => (
              <th key={c.title} className={c.className} scope="col">{c.title}</th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows.length === 0 ? (
            <tr><td colSpan={columns.length} className="empty">{empty}</td></tr>
          ) : (
            rows.map((row) => (
              <tr key={rowKey(row)}>
                {columns.map((c) => <td key={c.title} className={c.className}>{c.cell(row)}</td>)}
              </tr>
            ))
          )}
        </tbody>
      </table>
    </div>
  );
}
