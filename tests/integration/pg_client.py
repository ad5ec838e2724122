"""The tests' SQL on the test cluster (harness.psql) through libpq inside the test process,
with connections kept open per database.

A psql process and a new PostgreSQL backend for every statement cost about 80 ms of CPU
apiece on the test machine (a process start there is mostly page faults), and a run makes
about 500 of them. Here a statement borrows an open connection to its database (or opens
one), runs with libpq's PQexec, and gives the connection back; two threads at once get two
connections, so a statement that blocks (a lock held on purpose) never holds up another.
Rows come back as psql -At printed them: text values, NULL as "", a row that would print
as an empty line left out.
"""
import ctypes
import os
import threading

CONNECTION_OK = 0
PGRES_COMMAND_OK, PGRES_TUPLES_OK = 1, 2
PQTRANS_IDLE = 0
IDLE_PER_DATABASE = 2  # connections kept open per database once their statement is done

_LIB = []


def _libpq():
    if not _LIB:
        lib = ctypes.CDLL("libpq.so.5")
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        for name, res, args in (("PQconnectdb", vp, [cp]), ("PQstatus", i, [vp]),
                                ("PQerrorMessage", cp, [vp]), ("PQfinish", None, [vp]),
                                ("PQexec", vp, [vp, cp]), ("PQresultStatus", i, [vp]),
                                ("PQresultErrorMessage", cp, [vp]), ("PQntuples", i, [vp]),
                                ("PQnfields", i, [vp]), ("PQgetvalue", cp, [vp, i, i]),
                                ("PQclear", None, [vp]), ("PQtransactionStatus", i, [vp])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _LIB.append(lib)
    return _LIB[0]


class SqlError(RuntimeError):
    """PostgreSQL refused the statement (its message), or the connection failed."""


class _Conn:
    def __init__(self, conninfo):
        lib = _libpq()
        self.pid = os.getpid()
        self.handle = lib.PQconnectdb(conninfo.encode())
        if not self.handle or lib.PQstatus(self.handle) != CONNECTION_OK:
            why = lib.PQerrorMessage(self.handle).decode(errors="replace").strip() \
                if self.handle else "out of memory"
            self.close()
            raise SqlError(f"cannot connect: {why}")

    def dead(self):
        """Closed by the server (a test cut every backend of its database, say)."""
        return _libpq().PQstatus(self.handle) != CONNECTION_OK

    def broken(self):
        """Closed by the server, or left inside a transaction (a statement's own BEGIN):
        either way not for the next statement."""
        lib = _libpq()
        return (lib.PQstatus(self.handle) != CONNECTION_OK or
                lib.PQtransactionStatus(self.handle) != PQTRANS_IDLE)

    def run(self, sql):
        lib = _libpq()
        res = lib.PQexec(self.handle, sql.encode())
        if not res:
            raise SqlError(lib.PQerrorMessage(self.handle).decode(errors="replace").strip())
        try:
            status = lib.PQresultStatus(res)
            if status not in (PGRES_COMMAND_OK, PGRES_TUPLES_OK):
                why = lib.PQresultErrorMessage(res) or lib.PQerrorMessage(self.handle)
                raise SqlError(why.decode(errors="replace").strip())
            rows = []
            for r in range(lib.PQntuples(res)):
                row = [lib.PQgetvalue(res, r, c).decode() for c in range(lib.PQnfields(res))]
                if "\t".join(row):
                    rows.append(row)
            return rows
        finally:
            lib.PQclear(res)

    def close(self):
        if self.handle and self.pid == os.getpid():
            _libpq().PQfinish(self.handle)
        self.handle = None


class Pool:
    """Open connections per conninfo, this process's own (a forked child opens its own)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.idle = {}  # conninfo -> [_Conn]
        self.pid = os.getpid()

    def _take(self, conninfo):
        with self.lock:
            if self.pid != os.getpid():
                self.idle, self.pid = {}, os.getpid()
            spare = self.idle.get(conninfo)
            if spare:
                return spare.pop(), True
        return _Conn(conninfo), False

    def _give_back(self, conninfo, conn):
        with self.lock:
            spare = self.idle.setdefault(conninfo, [])
            if conn.pid == os.getpid() and len(spare) < IDLE_PER_DATABASE:
                spare.append(conn)
                return
        conn.close()

    def run(self, conninfo, sql):
        """Runs sql (one or more statements: the last one's rows come back). A kept
        connection the server closed meanwhile (a test cut every backend of a database)
        is replaced, once, by a new one."""
        conn, reused = self._take(conninfo)
        try:
            try:
                rows = conn.run(sql)
            except SqlError:
                if not (reused and conn.dead()):
                    raise
                conn.close()
                conn = _Conn(conninfo)
                rows = conn.run(sql)
        finally:
            if conn.handle and not conn.broken():
                self._give_back(conninfo, conn)
            else:
                conn.close()
        return rows

    def forget(self, conninfo):
        """Closes the kept connections to one database (before it is dropped)."""
        with self.lock:
            spare = self.idle.pop(conninfo, [])
        for conn in spare:
            conn.close()
