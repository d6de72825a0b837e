// pgJDBC against a pooler with prepareThreshold=1: every PreparedStatement is a named
// server-side statement from its first execution, reused across transactions whichever
// server the pooler gives them, and batches go out pipelined.
//
// The connection comes from PGWARD_HOST, PGWARD_PORT, PGWARD_USER, PGWARD_PASSWORD, PGWARD_DB;
// PGWARD_CLIENTS clients run at once, PGWARD_ROUNDS rounds each.

import java.math.BigDecimal;
import java.sql.Array;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;

public class JdbcDriver {
    static final String COLUMNS = "id, name, price, created, data, flag, score, tags";
    static final int CLIENTS = Integer.parseInt(env("PGWARD_CLIENTS", "5"));
    static final int ROUNDS = Integer.parseInt(env("PGWARD_ROUNDS", "8"));

    static String env(String name, String fallback) {
        String value = System.getenv(name);
        return value == null ? fallback : value;
    }

    static Connection connect() throws SQLException {
        String url = "jdbc:postgresql://" + env("PGWARD_HOST", "127.0.0.1") + ":"
                + System.getenv("PGWARD_PORT") + "/" + env("PGWARD_DB", "app")
                + "?prepareThreshold=1&sslmode=disable";
        Properties props = new Properties();
        props.setProperty("user", System.getenv("PGWARD_USER"));
        props.setProperty("password", env("PGWARD_PASSWORD", ""));
        return DriverManager.getConnection(url, props);
    }

    static void check(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError(what);
        }
    }

    /** pgJDBC logs in with extra_float_digits=3: whichever server runs the next statement has it. */
    static void floatDigitsFollow(Connection conn) throws SQLException {
        try (java.sql.Statement s = conn.createStatement();
                java.sql.ResultSet rs = s.executeQuery("SHOW extra_float_digits")) {
            check(rs.next(), "SHOW extra_float_digits: no row");
            String digits = rs.getString(1);
            check("3".equals(digits), "extra_float_digits is " + digits + ", not pgJDBC's 3");
        }
    }

    static int ident(int client, int round, int i) {
        return client * 10000 + round * 10 + i;
    }

    /** One client's prepared statements, reused for every round. */
    static final class Worker {
        final Connection conn;
        final PreparedStatement insert;
        final PreparedStatement select;
        final PreparedStatement count;
        final PreparedStatement sum;
        final PreparedStatement pid;

        Worker(Connection conn) throws SQLException {
            this.conn = conn;
            insert = conn.prepareStatement("INSERT INTO items (" + COLUMNS
                    + ") VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
            select = conn.prepareStatement("SELECT " + COLUMNS
                    + " FROM items WHERE id >= ? AND id < ? ORDER BY id");
            count = conn.prepareStatement("SELECT count(*) FROM items WHERE id = ?");
            sum = conn.prepareStatement("SELECT ?::int + ?::int, ?::text || ?::text");
            pid = conn.prepareStatement("SELECT pg_backend_pid()");
        }

        void bindRow(int id) throws SQLException {
            insert.setInt(1, id);
            insert.setString(2, "name " + id + " é");
            insert.setBigDecimal(3, new BigDecimal(id + ".25"));
            insert.setTimestamp(4, new Timestamp(1704110400000L + id * 60000L));
            insert.setBytes(5, new byte[] {(byte) id, 0, (byte) 255, 10});
            insert.setBoolean(6, id % 2 == 0);
            insert.setDouble(7, id / 4.0);
            insert.setArray(8, conn.createArrayOf("text", new String[] {"t" + id, null, "x"}));
        }

        void checkRow(ResultSet rs, int id) throws SQLException {
            check(rs.next(), "missing row " + id);
            check(rs.getInt(1) == id, "id");
            check(rs.getString(2).equals("name " + id + " é"), "name " + rs.getString(2));
            check(rs.getBigDecimal(3).equals(new BigDecimal(id + ".25")), "price");
            check(rs.getTimestamp(4).getTime() == 1704110400000L + id * 60000L, "created");
            check(Arrays.equals(rs.getBytes(5), new byte[] {(byte) id, 0, (byte) 255, 10}),
                    "data");
            check(rs.getBoolean(6) == (id % 2 == 0), "flag");
            check(rs.getDouble(7) == id / 4.0, "score");
            Array tags = rs.getArray(8);
            check(Arrays.equals((Object[]) tags.getArray(), new String[] {"t" + id, null, "x"}),
                    "tags");
        }

        int oneRound(int client, int round) throws SQLException {
            conn.setAutoCommit(false);
            int[] ids = {ident(client, round, 0), ident(client, round, 1), ident(client, round, 2)};
            for (int id : ids) {
                bindRow(id);
                insert.addBatch();
            }
            int[] counts = insert.executeBatch();
            check(counts.length == 3, "batch counts");
            select.setInt(1, ids[0]);
            select.setInt(2, ids[2] + 1);
            try (ResultSet rs = select.executeQuery()) {
                for (int id : ids) {
                    checkRow(rs, id);
                }
                check(!rs.next(), "extra row");
            }
            conn.commit();
            int doomed = ident(client, round, 5);
            bindRow(doomed);
            insert.executeUpdate();
            conn.rollback();
            conn.setAutoCommit(true);
            count.setInt(1, doomed);
            try (ResultSet rs = count.executeQuery()) {
                check(rs.next() && rs.getLong(1) == 0, "a rolled-back row is visible");
            }
            sum.setInt(1, round);
            sum.setInt(2, client);
            sum.setString(3, "a");
            sum.setString(4, "b");
            try (ResultSet rs = sum.executeQuery()) {
                check(rs.next() && rs.getInt(1) == round + client && rs.getString(2).equals("ab"),
                        "arithmetic");
            }
            try (ResultSet rs = pid.executeQuery()) {
                check(rs.next(), "pid");
                return rs.getInt(1);
            }
        }
    }

    /** Runs a prepared statement, then again while another connection's transaction holds the
     * server it ran on; returns how many servers it ran on. */
    static int movedStatement() throws SQLException {
        try (Connection conn = connect(); Connection holder = connect()) {
            PreparedStatement pinned = conn.prepareStatement("SELECT ?::int * 2, pg_backend_pid()");
            for (int attempt = 0; attempt < 30; attempt++) {
                int first = runPinned(pinned, attempt);
                holder.setAutoCommit(false);
                int held;
                try (Statement st = holder.createStatement();
                        ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
                    rs.next();
                    held = rs.getInt(1);
                }
                if (held == first) {
                    int second = runPinned(pinned, attempt + 1);
                    holder.rollback();
                    check(second != first, "ran on the held server");
                    return 2;
                }
                holder.rollback();
                holder.setAutoCommit(true);
            }
            return 1;
        }
    }

    static int runPinned(PreparedStatement pinned, int value) throws SQLException {
        pinned.setInt(1, value);
        try (ResultSet rs = pinned.executeQuery()) {
            check(rs.next() && rs.getInt(1) == value * 2, "pinned value");
            return rs.getInt(2);
        }
    }

    public static void main(String[] args) throws Exception {
        int moved = movedStatement();
        List<Thread> threads = new ArrayList<>();
        List<Throwable> failures = new ArrayList<>();
        AtomicInteger most = new AtomicInteger(moved);
        for (int c = 0; c < CLIENTS; c++) {
            final int client = c;
            Thread t = new Thread(() -> {
                try (Connection conn = connect()) {
                    Worker w = new Worker(conn);
                    Set<Integer> servers = new HashSet<>();
                    for (int round = 0; round < ROUNDS; round++) {
                        servers.add(w.oneRound(client, round));
                        floatDigitsFollow(conn);
                    }
                    most.accumulateAndGet(servers.size(), Math::max);
                } catch (Throwable err) {
                    synchronized (failures) {
                        failures.add(err);
                    }
                    err.printStackTrace();
                }
            });
            threads.add(t);
            t.start();
        }
        for (Thread t : threads) {
            t.join();
        }
        if (!failures.isEmpty()) {
            System.err.println("FAILED: " + failures.get(0));
            System.exit(1);
        }
        System.out.println("pgJDBC: " + CLIENTS + " clients, most servers seen by one client: "
                + most.get());
    }
}
