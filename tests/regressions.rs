//! Regression tests for faults pgward once had: each test plays the scenario that showed a
//! fault against PostgreSQL (or, where a misbehaving server is needed, a scripted one) and
//! checks what a correct pooler does, with deadlines instead of open-ended waits. The
//! numbered sections follow the list of faults they guard against.

mod common;

use common::raw::new_client_value;
use common::{eventually, Pgward, Postgres, SECOND};

// ---------------------------------------------------------------------------------------------
// 10. a reload that changes the server password.

#[test]
fn f10_reload_rotates_the_server_password() {
    let pg = Postgres::start();
    let dbs = format!(
        "rotated = {} user=scramuser password=scrampass\n",
        pg.db_connstr("app")
    );
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &dbs);
    // A holds its server, so the next client needs a new login.
    let mut holder = pw.client_as("trustuser", "rotated");
    assert_eq!(holder.value("SELECT current_user"), "scramuser");
    holder.value("BEGIN");

    pg.sql("ALTER ROLE scramuser PASSWORD 'newsecret'");
    let ini = common::read_lossy(&pw.ini_path);
    let rotated = ini.replace("password=scrampass", "password=newsecret");
    assert_ne!(ini, rotated);
    std::fs::write(&pw.ini_path, rotated).expect("rewrite the ini");
    let reloads = || pw.log().matches("configuration reloaded").count();
    let before = reloads();
    pw.reload();
    assert!(
        eventually(3 * SECOND, || reloads() > before),
        "{}",
        pw.log()
    );

    assert_eq!(
        new_client_value(
            &pw,
            ("trustuser", "rotated"),
            "SELECT current_user",
            5 * SECOND
        ),
        Ok("scramuser".to_string()),
        "new login after the password changed"
    );
    assert_eq!(holder.value("COMMIT"), "");
}
