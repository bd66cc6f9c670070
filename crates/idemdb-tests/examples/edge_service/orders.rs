//! What the two stores do differently in the purchase flow: the order row written in the
//! record's commit (a redb table in the embedded file, an SQL row in PostgreSQL), and counting
//! the orders. Everything else is the same code over [`Store`].

use std::future::Future;
use std::sync::Arc;

use idemdb::redb::{ReadableTableMetadata, TableDefinition, TableError};
use idemdb::{Error, ExecuteError, IdemDb, Reservation, Store};
use idemdb_postgres::{PgError, PgStore, PgTx, tokio_postgres};

use crate::BoxError;

/// Embedded: orders keyed by `user/key`, written in the same commit as the completed record.
pub const ORDERS: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");

/// PostgreSQL: the same orders as rows, their columns queryable (the load driver counts the
/// distinct charges).
const CREATE_ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (
    id text PRIMARY KEY,
    idem_key text NOT NULL,
    user_id text NOT NULL,
    sku text NOT NULL,
    cents bigint NOT NULL,
    charge text NOT NULL,
    fencing_token bigint NOT NULL,
    body text NOT NULL
)";

/// Serializes the `CREATE TABLE IF NOT EXISTS` of instances starting together (two of them
/// racing could both try to create the table's type and one fail).
const CREATE_LOCK: i64 = 0x0ed9_e5e7;

/// An order, as the purchase flow writes it once the provider has charged.
pub struct Order {
    /// `user/key`: one order per intent.
    pub id: String,
    pub key: String,
    pub user: String,
    pub sku: String,
    pub cents: u64,
    /// The provider's charge id ("" if its receipt had none).
    pub charge: String,
    /// The fencing token of the reservation that wrote it.
    pub token: u64,
    /// The JSON answered to the client and replayed to every duplicate: the record's response.
    pub json: String,
}

/// A store the purchase service runs on: idemdb's [`Store`] plus its business write.
pub trait OrderStore: Store {
    /// Completes `r` with `order.json` as the stored response and writes the order in the same
    /// commit: both or neither. `Closure` means the order could not be written (nothing was
    /// committed).
    fn complete_with_order(
        &self,
        r: &Reservation,
        order: &Order,
    ) -> impl Future<Output = Result<(), ExecuteError<BoxError, Self::Error>>> + Send;

    /// How many orders are stored.
    fn count_orders(self: Arc<Self>) -> impl Future<Output = Result<u64, BoxError>> + Send;
}

impl OrderStore for IdemDb {
    fn complete_with_order(
        &self,
        r: &Reservation,
        order: &Order,
    ) -> impl Future<Output = Result<(), ExecuteError<BoxError>>> + Send {
        let (row, stored) = (order.id.clone(), order.json.clone().into_bytes());
        let done =
            self.complete_with_async(r, order.json.clone(), move |tx| -> Result<(), Error> {
                tx.open_table(ORDERS)?
                    .insert(row.as_str(), stored.as_slice())?;
                Ok(())
            });
        async move {
            done.await.map_err(|e| match e {
                ExecuteError::Db(e) => ExecuteError::Db(e),
                ExecuteError::Closure(e) => ExecuteError::Closure(e.into()),
            })
        }
    }

    async fn count_orders(self: Arc<Self>) -> Result<u64, BoxError> {
        // Reading may wait for a commit under way: off the async threads.
        tokio::task::spawn_blocking(move || -> Result<u64, BoxError> {
            match self.begin_read()?.open_table(ORDERS) {
                Ok(orders) => Ok(orders.len()?),
                Err(TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(e.into()),
            }
        })
        .await?
    }
}

impl OrderStore for PgStore {
    async fn complete_with_order(
        &self,
        r: &Reservation,
        order: &Order,
    ) -> Result<(), ExecuteError<BoxError, PgError>> {
        let row = [
            &order.id,
            &order.key,
            &order.user,
            &order.sku,
            &order.charge,
            &order.json,
        ]
        .map(String::clone);
        let (cents, token) = (order.cents as i64, order.token as i64);
        // May run again after a serialization failure: it only writes through `tx`. Its
        // future borrows nothing but `tx`, so it takes a copy of the row each time.
        let written = self.complete_with(r, order.json.clone(), move |tx: &mut PgTx<'_>| {
            let [id, key, user, sku, charge, json] = row.clone();
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO orders (id, idem_key, user_id, sku, cents, charge, \
                     fencing_token, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    &[&id, &key, &user, &sku, &cents, &charge, &token, &json],
                )
                .await?;
                Ok::<_, tokio_postgres::Error>(())
            })
        });
        written.await.map_err(|e| match e {
            ExecuteError::Db(e) => ExecuteError::Db(e),
            ExecuteError::Closure(e) => ExecuteError::Closure(e.into()),
        })
    }

    async fn count_orders(self: Arc<Self>) -> Result<u64, BoxError> {
        let client = self.pool().get().await?;
        let row = client.query_one("SELECT count(*) FROM orders", &[]).await?;
        Ok(row.get::<_, i64>(0) as u64)
    }
}

/// Migrates idemdb's schema, connects a [`PgStore`] with `pool_size` connections and
/// creates the `orders` table if missing. Safe from several instances at once.
pub async fn connect_postgres(url: &str, pool_size: usize) -> Result<PgStore, BoxError> {
    let builder = PgStore::builder(url)?.pool_size(pool_size);
    builder.migrate().await?;
    let store = builder.connect().await?;
    let mut client = store.pool().get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
        .await?;
    tx.batch_execute(CREATE_ORDERS).await?;
    tx.commit().await?;
    Ok(store)
}
