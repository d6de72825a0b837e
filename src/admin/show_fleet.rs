//! SHOW FLEET: the limits shared with other pgward instances, as this instance last saw them.

use std::time::Instant;

use super::result::{Cell, Table, Ty};
use crate::fleet::View;
use crate::runtime::Runtime;

const N: Ty = Ty::Numeric;

const FLEET: &[(&str, Ty)] = &[
    ("instance", Ty::Int4),
    ("this", Ty::Text),
    ("resource", Ty::Text),
    ("capacity", N),
    ("demand", N),
    ("counted", N),
    ("share", N),
    ("state", Ty::Text),
    ("contact_ago", N),
    ("error", Ty::Text),
];

/// One row per instance and shared resource: the capacity, what the instance asked for, what
/// the store counts for it now (every grant it may still use), and for this instance the
/// share in force, its lease's state (`leased`, `fallback`, `lapsed`, `unleased`) and the
/// seconds since it last heard the store; for the others, the seconds since their last
/// report as of this instance's last exchange. Empty without a `[fleet]`.
pub fn fleet(rt: &Runtime) -> Table {
    let mut t = Table::new(FLEET);
    if let Some(view) = rt.fleet.view() {
        push_rows(&mut t, &view, Instant::now());
    }
    t
}

fn push_rows(t: &mut Table, view: &View, now: Instant) {
    let ago = |at: Option<Instant>| {
        at.map_or(Cell::Null, |at| {
            Cell::decimal(now.saturating_duration_since(at).as_secs_f64(), 3)
        })
    };
    for (resource, (capacity, demand)) in &view.wants {
        let counted = view.ledger.as_ref().and_then(|(l, at)| {
            l.members
                .get(&(view.instance, view.incarnation))
                .map(|m| m.in_use(resource, *at))
        });
        t.push(vec![
            Cell::Int(i64::from(view.instance)),
            "yes".into(),
            resource.clone().into(),
            Cell::decimal(*capacity, 3),
            Cell::decimal(*demand, 3),
            counted.map_or(Cell::Null, |c| Cell::decimal(c, 3)),
            view.shares
                .get(resource)
                .map_or(Cell::Null, |s| Cell::decimal(*s, 3)),
            view.standing.as_str().into(),
            ago(view.contact),
            Cell::from(view.error.clone()),
        ]);
    }
    let Some((ledger, at)) = &view.ledger else {
        return;
    };
    for ((id, _), m) in ledger
        .members
        .iter()
        .filter(|(key, _)| **key != (view.instance, view.incarnation))
    {
        let silent = at.saturating_sub(m.reported) >= ledger.terms.lease;
        for (resource, demand) in &m.demands {
            t.push(vec![
                Cell::Int(i64::from(*id)),
                "no".into(),
                resource.clone().into(),
                view.wants
                    .get(resource)
                    .map_or(Cell::Null, |(c, _)| Cell::decimal(*c, 3)),
                Cell::decimal(*demand, 3),
                Cell::decimal(m.in_use(resource, *at), 3),
                Cell::Null,
                if silent { "silent" } else { "reporting" }.into(),
                Cell::decimal(at.saturating_sub(m.reported).as_secs_f64(), 3),
                Cell::Null,
            ]);
        }
    }
}
