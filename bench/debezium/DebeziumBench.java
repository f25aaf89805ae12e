// Debezium 3.6 embedded engine + PostgreSQL connector (pgoutput) + Outbox Event Router SMT,
// producing the routed records to Kafka with acks=all and enable.idempotence=true.
//
// This is what Debezium Server's Kafka sink does, reduced to the essentials: the engine hands
// over a batch of (already EventRouter-transformed) SourceRecords, every record is sent with a
// callback, the batch waits for all acknowledgements, then the records are marked processed
// so the engine may commit their offsets (and flush the slot's LSN) afterwards.
//
// Configuration comes from environment variables (set by bench/run.py):
//   DBZ_PG_HOST, DBZ_PG_PORT, DBZ_PG_USER, DBZ_PG_PASSWORD, DBZ_PG_DB, DBZ_SLOT, DBZ_PUBLICATION,
//   DBZ_TOPIC_PREFIX (topic = prefix + aggregate_type), DBZ_KAFKA_BROKERS, DBZ_OFFSETS_FILE.
// Any further DBZ_PROP_<name>=<value> (name with '_' for '.') is passed to the engine as is.
// Runs until SIGTERM/SIGINT; then closes the engine and the producer.

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.ChangeEvent;
import io.debezium.embedded.Connect;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

public final class DebeziumBench {

    private static volatile boolean closing = false;

    private static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalArgumentException("missing environment variable " + name);
        }
        return v;
    }

    private static byte[] bytes(Object o) {
        if (o == null) {
            return null;
        }
        if (o instanceof byte[]) {
            return (byte[]) o;
        }
        return o.toString().getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        Properties producerProps = new Properties();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, env("DBZ_KAFKA_BROKERS"));
        producerProps.put(ProducerConfig.ACKS_CONFIG, "all");
        producerProps.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        producerProps.put(ProducerConfig.CLIENT_ID_CONFIG, "debezium-bench");
        final KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps);

        Properties p = new Properties();
        p.setProperty("name", "outbox-bench");
        p.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        p.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        p.setProperty("offset.storage.file.filename", env("DBZ_OFFSETS_FILE"));
        p.setProperty("database.hostname", env("DBZ_PG_HOST"));
        p.setProperty("database.port", env("DBZ_PG_PORT"));
        p.setProperty("database.user", env("DBZ_PG_USER"));
        p.setProperty("database.password", env("DBZ_PG_PASSWORD"));
        p.setProperty("database.dbname", env("DBZ_PG_DB"));
        p.setProperty("topic.prefix", "dbzbench");
        p.setProperty("plugin.name", "pgoutput");
        p.setProperty("slot.name", env("DBZ_SLOT"));
        p.setProperty("publication.name", env("DBZ_PUBLICATION"));
        p.setProperty("publication.autocreate.mode", "disabled");
        p.setProperty("snapshot.mode", "no_data");
        p.setProperty("table.include.list", "events.outbox");
        p.setProperty("transforms", "outbox");
        p.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        p.setProperty("transforms.outbox.table.field.event.id", "id");
        p.setProperty("transforms.outbox.table.field.event.key", "aggregate_id");
        p.setProperty("transforms.outbox.table.field.event.payload", "payload");
        p.setProperty("transforms.outbox.route.by.field", "aggregate_type");
        p.setProperty("transforms.outbox.route.topic.replacement", env("DBZ_TOPIC_PREFIX") + "${routedByValue}");
        p.setProperty("transforms.outbox.table.fields.additional.placement", "event_type:header:eventType");
        for (Map.Entry<String, String> e : System.getenv().entrySet()) {
            if (e.getKey().startsWith("DBZ_PROP_")) {
                p.setProperty(e.getKey().substring(9).replace('_', '.'), e.getValue());
            }
        }

        final AtomicReference<Throwable> sendError = new AtomicReference<>();
        DebeziumEngine.ChangeConsumer<ChangeEvent<SourceRecord, SourceRecord>> sink = (records, committer) -> {
            CountDownLatch latch = new CountDownLatch(records.size());
            for (ChangeEvent<SourceRecord, SourceRecord> rce : records) {
                SourceRecord r = rce.value();
                RecordHeaders headers = new RecordHeaders();
                for (Header h : r.headers()) {
                    headers.add(h.key(), bytes(h.value()));
                }
                ProducerRecord<byte[], byte[]> pr = new ProducerRecord<>(
                        r.topic(), null, null, bytes(r.key()), bytes(r.value()), headers);
                producer.send(pr, (md, ex) -> {
                    if (ex != null) {
                        sendError.compareAndSet(null, ex);
                    }
                    latch.countDown();
                });
            }
            latch.await();
            Throwable err = sendError.get();
            if (err != null) {
                throw new InterruptedException("Kafka send failed: " + err);
            }
            for (ChangeEvent<SourceRecord, SourceRecord> rce : records) {
                committer.markProcessed(rce);
            }
            committer.markBatchFinished();
        };

        final DebeziumEngine<ChangeEvent<SourceRecord, SourceRecord>> engine = DebeziumEngine.create(Connect.class)
                .using(p)
                .notifying(sink)
                .using((success, message, error) -> {
                    if (!success) {
                        System.err.println("debezium-bench: engine stopped: " + message);
                        if (error != null) {
                            error.printStackTrace();
                        }
                    }
                })
                .build();

        ExecutorService executor = Executors.newSingleThreadExecutor();
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            closing = true;
            try {
                engine.close();
                executor.shutdown();
                executor.awaitTermination(30, TimeUnit.SECONDS);
                producer.close();
            } catch (Exception e) {
                e.printStackTrace();
            }
        }));
        executor.execute(() -> {
            engine.run();
            stopped.countDown();
        });
        System.err.println("debezium-bench: engine started");
        stopped.await();
        System.err.println("debezium-bench: engine finished");
        // Reached only when the engine stops by itself (an error): exit non-zero without
        // waiting for the executor's non-daemon thread.
        if (!closing) {
            Runtime.getRuntime().halt(1);
        }
    }
}
