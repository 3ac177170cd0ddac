// The PostgreSQL JDBC driver (org.postgresql:postgresql, Maven Central) against Sluice's
// PostgreSQL listener: a plain query with WHERE PARTS, a prepared query run past the driver's
// prepareThreshold (server-side named statements), a prepared INSERT, the metadata calls
// database tools make (getTables, getColumns), and an error's SQLSTATE. Run by tests/pg.rs:
//   java -cp postgresql.jar tests/jdbc/SluiceJdbc.java HOST PORT
import java.sql.*;
import java.time.LocalDateTime;
import java.util.*;

public class SluiceJdbc {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/lab";
        Properties props = new Properties();
        props.setProperty("user", "admin");
        props.setProperty("password", "secret");
        List<String> out = new ArrayList<>();
        try (Connection c = DriverManager.getConnection(url, props)) {
            try (Statement s = c.createStatement();
                 ResultSet r = s.executeQuery("SELECT device, temp, n, ok, time FROM readings "
                         + "WHERE PARTS 20260102..20260103 ORDER BY device")) {
                while (r.next()) {
                    out.add(r.getString(1) + " " + r.getDouble(2) + " " + r.getLong(3) + " "
                            + r.getBoolean(4) + " " + r.getObject(5, LocalDateTime.class));
                }
            }
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT count(*) FROM readings WHERE temp > ? AND device <> ?")) {
                StringBuilder counts = new StringBuilder("counts");
                for (int i = 0; i < 7; i++) {
                    ps.setDouble(1, i % 2 == 0 ? -10.0 : 0.0);
                    ps.setString(2, "none");
                    try (ResultSet r = ps.executeQuery()) {
                        r.next();
                        counts.append(" ").append(r.getLong(1));
                    }
                }
                out.add(counts.toString());
            }
            try (PreparedStatement ps = c.prepareStatement("INSERT INTO events VALUES (?, ?)")) {
                ps.setObject(1, LocalDateTime.of(2026, 1, 4, 0, 0));
                ps.setString(2, "jdbc");
                out.add("inserted " + ps.executeUpdate());
            }
            DatabaseMetaData md = c.getMetaData();
            List<String> tables = new ArrayList<>();
            try (ResultSet r = md.getTables(null, "lab", "%", new String[] {"TABLE"})) {
                while (r.next()) {
                    tables.add(r.getString("TABLE_SCHEM") + "." + r.getString("TABLE_NAME"));
                }
            }
            out.add("tables " + String.join(",", tables));
            List<String> columns = new ArrayList<>();
            try (ResultSet r = md.getColumns(null, "lab", "readings", "%")) {
                while (r.next()) {
                    columns.add(r.getString("COLUMN_NAME") + ":" + r.getString("TYPE_NAME"));
                }
            }
            out.add("columns " + String.join(",", columns));
            try (Statement s = c.createStatement()) {
                s.executeQuery("SELECT * FROM nowhere");
                out.add("no error");
            } catch (SQLException e) {
                out.add("error " + e.getSQLState());
            }
        }
        System.out.println(String.join("\n", out));
    }
}
